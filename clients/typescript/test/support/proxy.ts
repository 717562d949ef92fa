// A scripted HTTP proxy in front of the real longcall: each request takes the next action, so a test can
// make the network fail in exact ways (a 503, a 429, an answer lost after the server acted) and see
// what the client sent each time.

import http from "node:http";
import type { AddressInfo } from "node:net";

export type Action =
  | { kind: "forward" }
  /** Forward, let the server act, then cut the connection instead of answering. */
  | { kind: "forward-then-drop" }
  | { kind: "answer"; status: number; headers?: Record<string, string>; body?: string };

export interface Seen {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  /** What the real server answered, for forwarded requests. */
  answer?: { status: number; body: string };
}

export interface Proxy {
  url: string;
  seen: Seen[];
  close(): Promise<void>;
}

/** Requests beyond the script are forwarded. */
export async function startProxy(target: string, script: Action[]): Promise<Proxy> {
  const seen: Seen[] = [];
  const server = http.createServer((req, res) => {
    const action = script.shift() ?? { kind: "forward" };
    const entry: Seen = { method: req.method ?? "", url: req.url ?? "", headers: req.headers };
    seen.push(entry);
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      if (action.kind === "answer") {
        res.writeHead(action.status, { "Content-Type": "application/json", ...action.headers });
        res.end(action.body ?? "");
        return;
      }
      void forward(target, req, Buffer.concat(chunks)).then(
        (answer) => {
          entry.answer = { status: answer.status, body: answer.body.toString("utf8") };
          if (action.kind === "forward-then-drop") {
            res.socket?.destroy();
            return;
          }
          res.writeHead(answer.status, answer.headers);
          res.end(answer.body);
        },
        () => res.socket?.destroy(),
      );
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    seen,
    close: () => new Promise((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}

interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

/** The request as it came (Host included: a presigned URL's signature covers it), sent on to `target`. */
function forward(target: string, req: http.IncomingMessage, body: Buffer): Promise<Answer> {
  const url = new URL(target);
  return new Promise((resolve, reject) => {
    const out = http.request({
      host: url.hostname, port: url.port, method: req.method, path: req.url, headers: req.headers,
    }, (answer) => {
      const chunks: Buffer[] = [];
      answer.on("data", (chunk: Buffer) => chunks.push(chunk));
      answer.on("end", () => resolve({ status: answer.statusCode ?? 502, headers: answer.headers,
        body: Buffer.concat(chunks) }));
      answer.on("error", reject);
    });
    out.on("error", reject);
    out.end(body);
  });
}
