// Writing a download to a file as the Python client does: beside the target under a temporary name,
// hashed as it goes, checked against what the answer announced, and moved into place only once complete;
// a failed download leaves nothing behind.

import { createHash, randomBytes } from "node:crypto";
import { createWriteStream } from "node:fs";
import { rename, unlink } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { Readable, Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { ReadableStream as NodeReadableStream } from "node:stream/web";

import { LongcallError } from "./errors.js";

/** What `jobs.download(id, index, path)` wrote: the file, its size and SHA-256 as received. */
export interface DownloadedOutput {
  path: string;
  bytes: number;
  sha256: string;
  contentType: string | null;
}

// longcall's own ETag for an output is its sha256.
const SHA256_ETAG = /^"([0-9a-f]{64})"$/;

export async function writeDownload(response: Response, path: string): Promise<DownloadedOutput> {
  const target = resolve(path);
  const part = join(dirname(target), `.longcall-${randomBytes(8).toString("hex")}.part`);
  const hash = createHash("sha256");
  let size = 0;
  const tap = new Transform({
    transform(chunk: Buffer, _encoding, done) {
      hash.update(chunk);
      size += chunk.byteLength;
      done(null, chunk);
    },
  });
  try {
    const body = response.body ? Readable.fromWeb(response.body as NodeReadableStream) : Readable.from([]);
    await pipeline(body, tap, createWriteStream(part, { flags: "wx" }));
    const sha256 = hash.digest("hex");
    const length = response.headers.get("content-length");
    const encoded = (response.headers.get("content-encoding") ?? "identity").toLowerCase() !== "identity";
    if (length !== null && /^\d+$/.test(length) && !encoded && Number(length) !== size) {
      throw new LongcallError("unexpected_response", `the output ended after ${size} of ${length} bytes`, 0);
    }
    const etag = SHA256_ETAG.exec(response.headers.get("etag") ?? "");
    if (etag && etag[1] !== sha256) {
      throw new LongcallError("unexpected_response", "the output's bytes do not match its sha256", 0);
    }
    await rename(part, target);
    return { path: target, bytes: size, sha256, contentType: response.headers.get("content-type") };
  } catch (err) {
    await unlink(part).catch(() => undefined);
    throw err;
  }
}
