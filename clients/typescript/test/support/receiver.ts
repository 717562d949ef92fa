// A notification receiver: records every POST (headers and raw body) and answers 204.

import http from "node:http";
import type { AddressInfo } from "node:net";

export interface Received {
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

export interface Receiver {
  /** The origin, for NOTIFY_ALLOWED_ORIGINS. */
  origin: string;
  received: Received[];
  /** Resolves with the first delivery (already received or still to come) that `match` accepts. */
  next(match: (r: Received) => boolean, timeoutMs: number): Promise<Received>;
  close(): Promise<void>;
}

export async function startReceiver(): Promise<Receiver> {
  const received: Received[] = [];
  const waiters: Array<() => void> = [];
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      received.push({ headers: req.headers, body: Buffer.concat(chunks) });
      res.writeHead(204).end();
      for (const wake of waiters.splice(0)) wake();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  const next = async (match: (r: Received) => boolean, timeoutMs: number) => {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const found = received.find(match);
      if (found) return found;
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no matching delivery within ${timeoutMs} ms (${received.length} received)`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  };
  return {
    origin: `http://127.0.0.1:${port}`,
    received,
    next,
    close: () => new Promise((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}
