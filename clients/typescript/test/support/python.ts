// The Python that runs longcall and its helpers for these tests: $PYTHON, else the repository's
// .venv (two folders above this package), else python3 from PATH.

import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

// This file runs as build/test/support/python.js.
export const PACKAGE_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
export const REPO_ROOT = path.resolve(PACKAGE_DIR, "../..");

export function pythonPath(): string {
  if (process.env.PYTHON) return process.env.PYTHON;
  const venv = path.join(REPO_ROOT, ".venv", "bin", "python");
  return existsSync(venv) ? venv : "python3";
}

/** Runs `python -c code` with `input` on stdin; resolves with stdout, rejects with its stderr's end. */
export function runPython(code: string, input = ""): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(pythonPath(), ["-c", code], { stdio: ["pipe", "pipe", "pipe"] });
    let out = "";
    let err = "";
    child.stdout.setEncoding("utf8").on("data", (chunk: string) => (out += chunk));
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => (err += chunk));
    child.on("error", reject);
    child.on("close", (code) => {
      if (code === 0) resolve(out);
      else reject(new Error(`python exited with code ${code}: ${err.trim().split("\n").slice(-3).join(" | ")}`));
    });
    child.stdin.end(input);
  });
}
