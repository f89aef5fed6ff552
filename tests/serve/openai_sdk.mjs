// The official OpenAI Node.js SDK (openai@4.95.0) against `cellshard serve`:
// a chat completion, a streamed completion equal to the same request not
// streamed (same seed), models.list and models.retrieve, the API key, and a
// model other than the served one surfaced as the SDK's NotFoundError.
// Usage: node openai_sdk.mjs CELLSHARD MODELS_DIR TMP_DIR
import OpenAI from "openai";
import { spawn } from "node:child_process";
import assert from "node:assert/strict";
import { createInterface } from "node:readline";

const [bin, models] = process.argv.slice(2);

function startServe(args) {
  const p = spawn(bin, ["serve", "-m", `${models}/stories260K.bin`, "-z", `${models}/tok512.bin`,
                        "--listen", "127.0.0.1:0", ...args], { stdio: ["ignore", "pipe", "inherit"] });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => { p.kill("SIGKILL"); reject(new Error("serve did not say 'listening' in 60 s")); }, 60000);
    createInterface({ input: p.stdout }).once("line", (line) => {
      clearTimeout(timer);
      const m = /^listening (.*):(\d+)$/.exec(line);
      if (!m) { p.kill("SIGKILL"); reject(new Error("unexpected first line: " + line)); return; }
      resolve({ proc: p, port: Number(m[2]) });
    });
    p.once("exit", (code) => reject(new Error("serve exited with " + code)));
  });
}

const srv = await startServe(["--nodes", "2", "--api-key", "sesame"]);
try {
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${srv.port}/v1`, apiKey: "sesame", maxRetries: 0 });

  const list = await client.models.list();
  assert.deepEqual(list.data.map((m) => m.id), ["stories260K"]);
  assert.equal((await client.models.retrieve("stories260K")).id, "stories260K");
  await assert.rejects(client.models.retrieve("gpt-4"), (e) => e instanceof OpenAI.NotFoundError && e.code === "model_not_found");

  const chat = await client.chat.completions.create({
    model: "stories260K", messages: [{ role: "user", content: "Tell me a story." }],
    max_tokens: 30, temperature: 0.8, seed: 3 });
  assert.equal(chat.object, "chat.completion");
  assert.equal(chat.choices[0].message.role, "assistant");
  assert.ok(chat.choices[0].message.content.length > 0, "empty chat answer");
  assert.ok(chat.usage.completion_tokens > 0 && chat.usage.completion_tokens <= 30);
  console.log("chat:", JSON.stringify(chat.choices[0].message.content));

  const params = { model: "stories260K", prompt: "Once upon a time", max_tokens: 40, temperature: 0.8, seed: 5 };
  const plain = await client.completions.create(params);
  let streamed = "", chunks = 0, finish = null;
  for await (const chunk of await client.completions.create({ ...params, stream: true })) {
    streamed += chunk.choices[0]?.text ?? "";
    if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
    chunks++;
  }
  assert.equal(streamed, plain.choices[0].text, "streamed text differs from the non-streamed one (same seed)");
  assert.equal(finish, plain.choices[0].finish_reason);
  assert.equal(chunks, plain.usage.completion_tokens + 1, "one chunk per token, then the finish chunk");
  console.log("completion:", JSON.stringify(streamed), "in", chunks, "chunks");

  // A streamed chat through the SDK's helper.
  let chatStreamed = "";
  const cs = await client.chat.completions.create({
    model: "stories260K", messages: [{ role: "user", content: "Tell me a story." }],
    max_tokens: 30, temperature: 0.8, seed: 3, stream: true });
  for await (const chunk of cs) chatStreamed += chunk.choices[0]?.delta?.content ?? "";
  assert.equal(chatStreamed, chat.choices[0].message.content);

  await assert.rejects(client.completions.create({ ...params, model: "gpt-4" }), (e) => e instanceof OpenAI.NotFoundError);
  const wrongKey = new OpenAI({ baseURL: `http://127.0.0.1:${srv.port}/v1`, apiKey: "wrong", maxRetries: 0 });
  await assert.rejects(wrongKey.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
  console.log("ok: openai SDK chat, streamed completion, models list and retrieve, 404, 401");
} finally {
  srv.proc.kill("SIGKILL");
}
