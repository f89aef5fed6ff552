// The page `cellshard serve` answers at "/": a chat box that streams the
// answer (POST /v1/chat/completions with stream: true, read as server-sent
// events through fetch), and a live view of the cluster polled from
// GET /v1/cluster every 500 ms. Plain HTML and JavaScript, no external
// resource, no build step. Element ids used by tests/serve: prompt, send,
// output, status, tps, nodes, placement, faults; fault buttons have the
// classes fault-crash / fault-freeze and data-node.
#include "serve/server.hpp"

namespace cellshard::serve {

const char* page_html() {
  return R"PAGE(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>cellshard serve</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body { font-family: system-ui, sans-serif; margin: 0; background: #f4f4f2; color: #222; }
header { background: #23313f; color: #fff; padding: 10px 16px; display: flex; gap: 16px; align-items: baseline; }
header h1 { font-size: 18px; margin: 0; }
main { display: grid; grid-template-columns: minmax(320px, 1fr) minmax(320px, 1fr); gap: 16px; padding: 16px; }
section { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 12px; }
h2 { font-size: 15px; margin: 0 0 8px 0; }
textarea { width: 100%; box-sizing: border-box; font: inherit; }
#output { white-space: pre-wrap; min-height: 160px; border: 1px solid #eee; padding: 8px; background: #fafafa; font-family: ui-monospace, monospace; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border-bottom: 1px solid #eee; padding: 3px 6px; text-align: left; }
.up { color: #1a7f37; } .down { color: #b42318; font-weight: bold; } .recovering { color: #b54708; }
.badge { padding: 2px 8px; border-radius: 10px; font-size: 12px; color: #222; }
.ready { background: #d1fadf; } .degraded { background: #fef0c7; } .failed { background: #fee4e2; }
button { font: inherit; }
#faults li { font-size: 13px; }
.row { display: flex; gap: 8px; align-items: center; margin: 6px 0; flex-wrap: wrap; }
.row input { width: 70px; }
</style>
</head>
<body>
<header><h1>cellshard serve</h1><span id="model"></span><span id="status" class="badge">...</span>
<span>tokens/s: <b id="tps">0</b></span><span>sessions: <b id="sessions">0</b></span></header>
<main>
<section>
<h2>Chat</h2>
<textarea id="prompt" rows="3">Once upon a time</textarea>
<div class="row">
<label>max tokens <input id="max_tokens" type="number" value="200"></label>
<label>temperature <input id="temperature" type="number" step="0.1" value="0.8"></label>
<label>seed <input id="seed" type="number" value="42"></label>
<label>API key <input id="apikey" type="password" style="width:120px"></label>
<button id="send">Send</button><button id="stop" disabled>Stop</button>
</div>
<div id="output"></div>
<div class="row" id="streaminfo"></div>
</section>
<section>
<h2>Nodes</h2>
<table><thead><tr><th>node</th><th>role</th><th>memory</th><th>state</th><th id="faultcol"></th></tr></thead>
<tbody id="nodes"></tbody></table>
<h2 style="margin-top:12px">Placement</h2>
<table><thead><tr><th>index</th><th>stage</th><th>layers</th><th>node</th><th>KV</th><th>sessions</th><th>compute s</th></tr></thead>
<tbody id="placement"></tbody></table>
<h2 style="margin-top:12px">Faults</h2>
<ul id="faults"></ul>
</section>
</main>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const key = () => $("apikey").value || localStorage.getItem("cellshard-key") || "";
function headers() {
  const h = { "Content-Type": "application/json" };
  if (key()) h["Authorization"] = "Bearer " + key();
  return h;
}
function kib(b) { return (b / 1024).toFixed(0) + " KiB"; }
let controller = null;
async function send() {
  if (key()) localStorage.setItem("cellshard-key", key());
  const out = $("output");
  out.textContent = "";
  $("send").disabled = true; $("stop").disabled = false;
  controller = new AbortController();
  const body = { messages: [{ role: "user", content: $("prompt").value }], stream: true,
                 max_tokens: Number($("max_tokens").value), temperature: Number($("temperature").value),
                 seed: Number($("seed").value), stream_options: { include_usage: true } };
  let tokens = 0;
  const t0 = performance.now();
  try {
    const res = await fetch("/v1/chat/completions", { method: "POST", headers: headers(),
                                                       body: JSON.stringify(body), signal: controller.signal });
    if (!res.ok) { out.textContent = "error " + res.status + ": " + (await res.text()); return; }
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let k;
      while ((k = buf.indexOf("\n\n")) >= 0) {
        const ev = buf.slice(0, k); buf = buf.slice(k + 2);
        for (const line of ev.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const c = JSON.parse(data);
          if (c.error) { out.textContent += "\n[error: " + c.error.message + "]"; continue; }
          for (const ch of c.choices || []) {
            if (ch.delta && ch.delta.content) { out.textContent += ch.delta.content; tokens++; }
          }
        }
      }
      $("streaminfo").textContent = tokens + " tokens, " + ((performance.now() - t0) / 1000).toFixed(2) + " s";
    }
    out.dataset.done = "1";
  } catch (e) {
    if (e.name !== "AbortError") out.textContent += "\n[" + e + "]";
  } finally {
    $("send").disabled = false; $("stop").disabled = true; controller = null;
  }
}
async function fault(node, kind) {
  const res = await fetch("/v1/cluster/fault", { method: "POST", headers: headers(),
                                                 body: JSON.stringify({ node: node, kind: kind }) });
  if (!res.ok) alert("fault: " + (await res.text()));
}
async function poll() {
  try {
    const res = await fetch("/v1/cluster", { headers: headers() });
    if (res.ok) render(await res.json());
  } catch (e) { $("status").textContent = "unreachable"; $("status").className = "badge failed"; }
  setTimeout(poll, 500);
}
function cell(tr, text, cls) { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; tr.appendChild(td); return td; }
function render(v) {
  $("model").textContent = v.model;
  $("status").textContent = v.status; $("status").className = "badge " + v.status;
  $("tps").textContent = v.tokens_per_s.toFixed(1);
  $("sessions").textContent = v.sessions + " / " + v.max_sessions;
  $("faultcol").textContent = v.fault_injection ? "inject" : "";
  const nodes = $("nodes"); nodes.textContent = "";
  for (const n of v.nodes) {
    const tr = document.createElement("tr");
    cell(tr, n.node); cell(tr, n.role); cell(tr, kib(n.memory_bytes)); cell(tr, n.state, n.state);
    const td = cell(tr, "");
    if (v.fault_injection && n.shards.length > 0 && n.state === "up") {
      for (const kind of ["crash", "freeze"]) {
        const b = document.createElement("button");
        b.textContent = kind; b.className = "fault-" + kind; b.dataset.node = n.node;
        b.onclick = () => fault(n.node, kind);
        td.appendChild(b);
      }
    }
    nodes.appendChild(tr);
  }
  const pl = $("placement"); pl.textContent = "";
  for (const p of v.placement) {
    const tr = document.createElement("tr");
    cell(tr, p.index); cell(tr, p.stage + (p.rank ? "/" + p.rank : "")); cell(tr, p.layers); cell(tr, p.node);
    cell(tr, p.answering ? kib(p.kv_bytes) : "-"); cell(tr, p.answering ? p.sessions : "no answer", p.answering ? "" : "down");
    cell(tr, p.answering ? p.compute_s.toFixed(3) : "-");
    pl.appendChild(tr);
  }
  const fl = $("faults"); fl.textContent = "";
  for (const f of v.faults) {
    const li = document.createElement("li");
    li.textContent = f.kind + " of shard " + f.index + " on node " + f.node + " at position " + f.step +
      ": detected in " + (f.detect_ms >= 0 ? f.detect_ms.toFixed(1) + " ms" : "?") +
      (f.recovered ? ", recovered in " + f.recover_ms.toFixed(1) + " ms on node " + f.moved_to_node
                   : f.restarted ? ", recovering" : ", no restart needed so far");
    fl.appendChild(li);
  }
}
$("send").onclick = send;
$("stop").onclick = () => { if (controller) controller.abort(); };
poll();
</script>
</body>
</html>
)PAGE";
}

}  // namespace cellshard::serve
