// Downloads when outputs live in S3: longcall answers 302 to a presigned URL, and the client must follow it
// WITHOUT its Authorization (nor Longcall-Owner) header. A real S3-protocol server (moto, as the Python
// suite uses) sits behind a recording proxy, and longcall's S3_ENDPOINT_URL is that proxy, so the
// presigned URLs point at it and the test sees exactly what the client sent to storage.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, before, test } from "node:test";

import { Client } from "longcall-client";

import { type Longcall, QUICK_JOB, startLongcall } from "./support/longcall.js";
import { type Running, startReady } from "./support/process.js";
import { type Proxy, startProxy } from "./support/proxy.js";
import { pythonPath } from "./support/python.js";

const MOTO = `
import json, logging, sys
from moto.server import ThreadedMotoServer
logging.getLogger("werkzeug").setLevel(logging.WARNING)
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
print(json.dumps({"endpoint_url": f"http://{host}:{port}"}), flush=True)
sys.stdin.read()
server.stop()
`;
const BUCKET = "ts-client-outputs";
// Dummy credentials for moto; never a developer's real profile.
const AWS_ENV = {
  AWS_ACCESS_KEY_ID: "testing",
  AWS_SECRET_ACCESS_KEY: "testing",
  AWS_DEFAULT_REGION: "us-east-1",
  AWS_REGION: "us-east-1",
  AWS_CONFIG_FILE: "/dev/null",
  AWS_SHARED_CREDENTIALS_FILE: "/dev/null",
};

let moto: Running<{ endpoint_url: string }>;
let storage: Proxy;
let server: Running<Longcall>;

before(async () => {
  moto = await startReady(pythonPath(), ["-c", MOTO], 60_000);
  storage = await startProxy(moto.info.endpoint_url, []);
  const made = await fetch(`${storage.url}/${BUCKET}`, { method: "PUT" });
  assert.equal(made.status, 200, await made.text());
  server = await startLongcall({
    env: { ...AWS_ENV, STORAGE_URL: `s3://${BUCKET}/outputs`, S3_ENDPOINT_URL: storage.url },
  });
}, { timeout: 240_000 });

after(async () => {
  await server?.stop();
  await storage?.close();
  await moto?.stop();
});

test("download follows the 302 to storage without the API key", { timeout: 60_000 }, async () => {
  const lc = server.info;
  const client = new Client({ baseUrl: lc.base_url, apiKey: lc.api_key });
  const created = await client.jobs.create({ ...QUICK_JOB, input: { ...QUICK_JOB.input, outputs: 2 }, maxCredits: 10 });
  const job = await client.jobs.wait(created.id, { timeoutMs: 45_000 });
  assert.equal(job.status, "succeeded", JSON.stringify(job.error));
  assert.equal(job.outputs.length, 2);

  // The server itself redirects (so this test is about the redirect, not a streamed answer).
  const direct = await fetch(`${lc.base_url}${job.outputs[0]!.url}`, {
    headers: { Authorization: `Bearer ${lc.api_key}` }, redirect: "manual",
  });
  assert.equal(direct.status, 302);
  assert.ok(direct.headers.get("location")?.startsWith(`${storage.url}/`));
  await direct.body?.cancel();

  const before = storage.seen.length;
  for (const output of job.outputs) {
    const bytes = await client.jobs.download(job.id, output.index);
    assert.equal(bytes.byteLength, output.bytes);
    assert.equal(createHash("sha256").update(bytes).digest("hex"), output.sha256);
  }
  const fetched = storage.seen.slice(before);
  assert.equal(fetched.length, 2, "one storage request per output");
  for (const seen of fetched) {
    assert.equal(seen.method, "GET");
    assert.match(seen.url, /X-Amz-Signature=/, "a presigned URL");
    assert.equal(seen.headers.authorization, undefined, "no Authorization sent to storage");
    assert.equal(seen.headers["longcall-owner"], undefined);
    assert.equal(seen.answer?.status, 200);
  }
  // The proxy does see Authorization when there is one: longcall's own uploads are signed with it.
  assert.ok(storage.seen.some((s) => s.method === "PUT" && s.headers.authorization?.startsWith("AWS4-HMAC-SHA256")));
});
