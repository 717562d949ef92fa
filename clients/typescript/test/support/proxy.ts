// A scripted HTTP proxy in front of the real longcall: each request takes the next action, so a test can
// make the network fail in exact ways (a 503, a 429, an answer lost after the server acted) and see
// what the client sent each time.

import http from "node:http";
import type { AddressInfo } from "node:net";

export type Action =
  | { kind: "forward" }
  /** Forward, let the server act, then cut the connection instead of answering. */
  | { kind: "forward-then-drop" }
  /** Forward, then send the answer's headers and half its body, and cut the connection. */
  | { kind: "forward-then-cut-body" }
  /** Forward, then send the answer's headers and half its body, and nothing more (until the proxy closes). */
  | { kind: "forward-then-stall-body" }
  /** Forward, and answer no sooner than `ms` after the request came (a long poll held its whole wait). */
  | { kind: "forward-held"; ms: number }
  /** Cut the connection without forwarding: the server never sees the request. */
  | { kind: "drop" }
  | { kind: "answer"; status: number; headers?: Record<string, string>; body?: string };

export interface Seen {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  /** What the real server answered, for forwarded requests. */
  answer?: { status: number; body: string };
  /** The answer's headers went out, but not all of its body (forward-then-cut-body, -stall-body). */
  partial?: boolean;
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
    const arrived = Date.now();
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
      if (action.kind === "drop") {
        res.socket?.destroy();
        return;
      }
      void forward(target, req, Buffer.concat(chunks)).then(
        (answer) => {
          entry.answer = { status: answer.status, body: answer.body.toString("utf8") };
          if (action.kind === "forward-then-drop") {
            res.socket?.destroy();
            return;
          }
          if (action.kind === "forward-then-cut-body" || action.kind === "forward-then-stall-body") {
            // The full length announced, so the client knows the body is not all there.
            const { "transfer-encoding": _chunked, ...headers } = answer.headers;
            res.writeHead(answer.status, { ...headers, "content-length": String(answer.body.length) });
            entry.partial = true;
            // Cut only once the half is written out: the client gets the headers and part of the body.
            res.write(answer.body.subarray(0, Math.floor(answer.body.length / 2)),
              () => action.kind === "forward-then-cut-body" && res.socket?.destroy());
            return;
          }
          const send = () => {
            res.writeHead(answer.status, answer.headers);
            res.end(answer.body);
          };
          if (action.kind === "forward-held") setTimeout(send, Math.max(0, arrived + action.ms - Date.now()));
          else send();
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
