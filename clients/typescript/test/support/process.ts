// A long-running helper process that prints one JSON line when ready and stops when its stdin closes.

import { type ChildProcess, spawn } from "node:child_process";

export interface Running<T> {
  info: T;
  stop(): Promise<void>;
}

const STOP_GRACE_MS = 20_000;

export function startReady<T>(command: string, args: string[], readyTimeoutMs: number): Promise<Running<T>> {
  const child = spawn(command, args, { stdio: ["pipe", "pipe", "pipe"] });
  let stderr = "";
  child.stderr!.setEncoding("utf8").on("data", (chunk: string) => {
    stderr = (stderr + chunk).slice(-4000);
  });
  return new Promise((resolve, reject) => {
    let stdout = "";
    const timer = setTimeout(() => {
      fail(new Error(`${args[0] ?? command}: not ready within ${readyTimeoutMs} ms; stderr: ${stderr.trim()}`));
    }, readyTimeoutMs);
    const fail = (err: Error) => {
      clearTimeout(timer);
      void stopChild(child);
      reject(err);
    };
    child.on("error", fail);
    child.on("exit", (code) => fail(new Error(`${args[0] ?? command} exited with code ${code}: ${stderr.trim()}`)));
    child.stdout!.setEncoding("utf8").on("data", (chunk: string) => {
      stdout += chunk;
      const newline = stdout.indexOf("\n");
      if (newline < 0) return;
      clearTimeout(timer);
      child.removeAllListeners("exit");
      try {
        resolve({ info: JSON.parse(stdout.slice(0, newline)) as T, stop: () => stopChild(child) });
      } catch (err) {
        fail(err as Error);
      }
    });
  });
}

/** Close its stdin (its way to stop, cleaning up); SIGTERM, then SIGKILL, if it lingers. */
function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const term = setTimeout(() => child.kill("SIGTERM"), STOP_GRACE_MS);
    const kill = setTimeout(() => child.kill("SIGKILL"), 2 * STOP_GRACE_MS);
    child.on("exit", () => {
      clearTimeout(term);
      clearTimeout(kill);
      resolve();
    });
    child.stdin!.end();
  });
}
