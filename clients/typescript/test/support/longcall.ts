// A real longcall for the tests, started by clients/testing/serve_longcall.py (shared with the Python client).

import path from "node:path";

import { type Running, startReady } from "./process.js";
import { REPO_ROOT, pythonPath } from "./python.js";

export interface Longcall {
  base_url: string;
  api_key: string;
  owner_id: string;
  sim_url: string;
  database_url: string;
  /** With `platform: true`: a second owner, a platform one (same credits and max active). */
  platform_api_key?: string;
  platform_owner_id?: string;
}

// The launcher allows itself 120 s on a loaded machine; we allow it a little more.
const READY_TIMEOUT_MS = 150_000;

export interface StartOptions {
  credits?: number;
  maxActive?: number;
  /** Also make a platform owner (the launcher's --platform). */
  platform?: boolean;
  env?: Record<string, string>;
}

export function startLongcall(options: StartOptions = {}): Promise<Running<Longcall>> {
  const args = [path.join(REPO_ROOT, "clients", "testing", "serve_longcall.py")];
  if (options.credits !== undefined) args.push("--credits", String(options.credits));
  if (options.maxActive !== undefined) args.push("--max-active", String(options.maxActive));
  if (options.platform) args.push("--platform");
  for (const [key, value] of Object.entries(options.env ?? {})) args.push("--env", `${key}=${value}`);
  return startReady<Longcall>(pythonPath(), args, READY_TIMEOUT_MS);
}

/** A simulated job that succeeds in about a second. */
export const QUICK_JOB = { provider: "sim", model: "image-fast", input: { prompt: "a lighthouse", duration_s: 0.5 } };
