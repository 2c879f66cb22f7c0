// The MCP front door's flow from the official TypeScript MCP SDK client (SPEC §3.7).
//
// usage: node flow.mjs --programs FILE (--url http://host:port/mcp | --stdio PYTHON [ARGS...])
//
// Lists the tools, runs the program that calls two MCP servers through `exec`, finishes
// it with `wait`, runs a failing exec, cancels an exec and a wait leg (AbortSignal ->
// notifications/cancelled), and prints one JSON report on stdout, the same keys as the
// Python client's (tests/support/frontdoor.py check_report reads both).
import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { LoggingMessageNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

const argv = process.argv.slice(2);
const opt = (name) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : undefined;
};
const programs = JSON.parse(readFileSync(opt("--programs"), "utf8"));
const CALL_TIMEOUT_MS = 60000;
const ABORT_REASON = "the test cancels this call";

function transport() {
  const url = opt("--url");
  if (url) return new StreamableHTTPClientTransport(new URL(url));
  const i = argv.indexOf("--stdio");
  const [command, ...args] = argv.slice(i + 1);
  return new StdioClientTransport({ command, args, env: { ...process.env }, cwd: process.cwd(), stderr: "inherit" });
}

function collector() {
  const c = { messages: [], waiters: new Map() };
  c.seen = (text) => {
    if (!c.waiters.has(text)) {
      const w = { done: false };
      w.promise = new Promise((resolve) => (w.resolve = resolve));
      c.waiters.set(text, w);
    }
    return c.waiters.get(text);
  };
  c.onprogress = (p) => {
    const entry = JSON.parse(p.message ?? "null");
    c.messages.push(entry);
    if (entry && entry.type === "text") {
      const w = c.seen(entry.text);
      w.done = true;
      w.resolve();
    }
  };
  return c;
}

async function call(client, name, args, progress) {
  const options = { timeout: CALL_TIMEOUT_MS };
  if (progress) options.onprogress = progress.onprogress;
  const result = await client.callTool({ name, arguments: args }, undefined, options);
  const out = { content: result.content, structuredContent: result.structuredContent, isError: result.isError };
  if (progress) out.progress = [...progress.messages];
  return out;
}

async function cancelAfter(client, name, args, marker) {
  const progress = collector();
  const seen = progress.seen(marker);
  const controller = new AbortController();
  let endedFirst = false;
  const pending = client
    .callTool({ name, arguments: args }, undefined, { timeout: CALL_TIMEOUT_MS, signal: controller.signal, onprogress: progress.onprogress })
    // The SDK sends notifications/cancelled and rejects with the abort reason.
    .then(() => ((endedFirst = true), "completed"), (err) => (String(err).includes(ABORT_REASON) ? "aborted" : `error: ${err}`));
  await Promise.race([seen.promise, pending]);
  controller.abort(ABORT_REASON);
  const outcome = await pending;
  return { streamed: seen.done, cancelled: outcome === "aborted" && !endedFirst };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const runIdOf = (result) => JSON.parse(result.content[0].text).runId ?? "";

const t0 = Date.now();
const timings = {};
const client = new Client({ name: "cellblock-frontdoor-ts", version: "0.1.0" });
const logs = [];
client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
  if (n.params.logger === "cellblock.output") logs.push(n.params.data);
});
const tr = transport();
await client.connect(tr);
await client.setLoggingLevel("info");
const report = { timings, logs };
report.tools = (await client.listTools()).tools.map((t) => ({ name: t.name, description: t.description, inputSchema: t.inputSchema }));

let t = Date.now();
report.first = await call(client, "exec", { code: programs.program }, collector());
report.resumed = await call(client, "wait", { runId: runIdOf(report.first) }, collector());
timings["exec+wait"] = (Date.now() - t) / 1000;

report.failed = await call(client, "exec", { code: "throw new Error('boom')" });

t = Date.now();
report.cancelExec = await cancelAfter(client, "exec", { code: programs.cancelledExec }, "started");
await sleep(Math.max(0, programs.cancelledExecWouldFinishMs - (Date.now() - t)));
report.check = await call(client, "exec", { code: programs.checkCancelled });
timings["cancel exec"] = (Date.now() - t) / 1000;

t = Date.now();
report.parked = await call(client, "exec", { code: programs.cancelledWait });
const parkedId = runIdOf(report.parked);
report.cancelWait = await cancelAfter(client, "wait", { runId: parkedId }, "resumed");
const deadline = Date.now() + 20000;
for (;;) {
  report.again = await call(client, "wait", { runId: parkedId });
  if (!report.again.content[0].text.includes("already being resumed") || Date.now() > deadline) break;
  await sleep(100);
}
timings["cancel wait"] = (Date.now() - t) / 1000;
timings.flow = (Date.now() - t0) / 1000;

if (tr instanceof StreamableHTTPClientTransport) await tr.terminateSession();
await client.close();
process.stdout.write(JSON.stringify(report) + "\n");
