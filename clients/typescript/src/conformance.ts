// Conformance CLI of the TypeScript client: runs one scenario, prints one JSON object.
//
//   node dist/conformance.js <scenario> <address> [--spec ../conformance/scenarios.json]
//
// Scenarios, handlers and the printed shape: clients/README.md ("Conformance table"). The
// Python and Go CLIs implement the same list; tests/integration/test_client_conformance.py
// compares the three. Exit codes: 0 observations printed, 1 the scenario failed, 2 bad usage.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import {
  CellblockClient,
  RpcError,
  rpcError,
  ToolRefusal,
  type ExecOptions,
  type Handlers,
  type JsonObject,
  type JsonValue,
  type OutputEntry,
  type RunResult,
  type ScopeLike,
  type ToolCallInfo,
  type ToolHandler,
  type ToolSpec,
} from "./client.js";
import { CodeModeService, ExecRequestSchema, ToolResultSchema, WaitRequestSchema, type ExecRequest } from "./gen/cellblock/v1/code_mode_service_pb.js";

interface Spec {
  tools: ToolSpec[];
  programs: Record<string, string>;
  limits?: Record<string, ExecOptions["limits"]>;
}

interface CallObservation {
  catalogId: string;
  source: string;
  owner: string;
  name: string;
  method: string;
  input: JsonValue;
  n: number;
  idsWellFormed: boolean;
}

type Observation = { [key: string]: unknown };

class Scenario {
  readonly scope: ScopeLike;
  readonly execId: string;
  readonly calls: CallObservation[] = [];
  readonly streamed: OutputEntry[] = [];
  /** `slow` call i answers once gate i opens (suspend_resume). */
  private readonly gates = new Map<number, { open: () => void; opened: Promise<void> }>();

  constructor(
    readonly client: CellblockClient,
    readonly spec: Spec,
    readonly name: string,
  ) {
    this.scope = { sessionId: `conf-typescript-${process.pid}`, agentRunId: name };
    this.execId = `call-${name}`;
  }

  get program(): string {
    const code = this.spec.programs[this.name];
    if (code === undefined) throw new Error(`no program for ${this.name}`);
    return code;
  }

  async register(scope: ScopeLike = this.scope): Promise<Observation> {
    const catalog = await this.client.putCatalog(scope, this.spec.tools);
    return { ids: catalog.entries.map((e) => e.id), catalogSize: catalog.telemetry?.catalogSize ?? 0 };
  }

  gate(i: number): { open: () => void; opened: Promise<void> } {
    let g = this.gates.get(i);
    if (g === undefined) {
      let open: () => void = () => {};
      const opened = new Promise<void>((resolve) => (open = resolve));
      g = { open: () => open(), opened };
      this.gates.set(i, g);
    }
    return g;
  }

  onOutput(entry: OutputEntry): void {
    this.streamed.push(entry);
    if (entry.type === "text" && entry.text === "after late-1") this.gate(2).open(); // sent on the open wait stream
  }

  record(call: ToolCallInfo, input: JsonValue): void {
    this.calls.push({
      catalogId: call.catalogId,
      source: call.source,
      owner: call.owner,
      name: call.name,
      method: call.method,
      input,
      n: Number(call.nestedCallId.slice(call.nestedCallId.lastIndexOf("_") + 1)),
      idsWellFormed: idsWellFormed(this.execId, call),
    });
  }

  /** The shared handlers (clients/README.md); `unserved` deliberately has none. */
  handlers(overrides: Handlers = {}): Handlers {
    const echo: ToolHandler = (input) => ({ content: [{ type: "text", text: "echo" }], details: { echo: input } });
    const boom: ToolHandler<{ n?: number }> = (input) => {
      throw new Error(`boom ${input.n}`);
    };
    const refuse: ToolHandler<{ n?: number }> = (input) => {
      throw new ToolRefusal("invalid_input", `n must be positive, got ${input.n}`);
    };
    const blocked: ToolHandler = () => {
      throw new ToolRefusal("blocked", "needs approval");
    };
    const cancelled: ToolHandler = () => {
      throw new ToolRefusal("cancelled", "operator cancelled");
    };
    const silent: ToolHandler = () => {
      throw new ToolRefusal("failed", "");
    };
    const huge: ToolHandler<{ bytes?: number }> = (input) => ({ details: { blob: "x".repeat(input.bytes ?? 0) } });
    const slow: ToolHandler<{ i?: number }> = async (input) => {
      await this.gate(input.i ?? 0).opened;
      return { details: { answer: `late-${input.i}` } };
    };
    const lookup: ToolHandler<{ key?: string }> = (input) => ({
      details: { value: input.key === "bad-shape" ? 42 : `v-${input.key}` },
    });
    const table: Handlers = { echo, boom, refuse, blocked, cancelled, silent, huge, slow, lookup, ...overrides };
    const recorded: { [name: string]: ToolHandler<any, any> } = {};
    for (const [name, handler] of Object.entries(table)) {
      recorded[name] = (input: JsonValue, call: ToolCallInfo) => {
        this.record(call, input);
        return handler(input, call);
      };
    }
    return recorded;
  }

  /** Runs the scenario's program as an exec leg with its limits (scenarios.json), recording its output. */
  exec(handlers: Handlers, extra: Partial<ExecOptions> = {}): Promise<RunResult> {
    const limits = this.spec.limits?.[this.name];
    return this.client.exec(this.scope, {
      toolCallId: this.execId,
      code: this.program,
      handlers,
      onOutput: (e) => this.onOutput(e),
      ...(limits ? { limits } : {}),
      ...extra,
    });
  }

  wait(runId: string, handlers: Handlers = {}): Promise<RunResult> {
    return this.client.wait(this.scope, { toolCallId: `${this.execId}-wait`, runId, handlers, onOutput: (e) => this.onOutput(e) });
  }
}

function idsWellFormed(execId: string, call: ToolCallInfo): boolean {
  const prefix = execId.replace(/[^A-Za-z0-9_-]/g, "_").slice(0, 48);
  const escaped = prefix.replace(/[-]/g, "\\-");
  return (
    call.parentToolCallId === execId &&
    /^replay_[0-9a-f]{24}$/.test(call.replayId) &&
    /^run_[0-9a-f]{32}$/.test(call.runId) &&
    new RegExp(`^cellblock_${escaped}_${call.replayId.slice(7, 15)}_[1-9][0-9]*$`).test(call.nestedCallId)
  );
}

function leg(r: RunResult): Observation {
  const body: JsonObject = JSON.parse(r.resultJson) as JsonObject;
  if ("runId" in body) body["runId"] = "<run>";
  const telemetry = body["telemetry"];
  if (typeof telemetry === "object" && telemetry !== null && !Array.isArray(telemetry) && "counterScope" in telemetry) {
    telemetry["counterScope"] = "<scope>";
  }
  return {
    result: body,
    status: r.status,
    code: r.code,
    runIdSet: r.runId !== "",
    legCount: r.metadata.legCount,
    bridgeCalls: r.metadata.bridgeCalls,
  };
}

async function statusOf(call: Promise<unknown>): Promise<{ code: string; message: string }> {
  try {
    await call;
    return { code: "OK", message: "" };
  } catch (err) {
    if (err instanceof RpcError) return { code: err.code, message: err.rawMessage };
    throw err;
  }
}

/** A leg's observations, or the gRPC status it was refused with. */
async function legOrStatus(call: Promise<RunResult>): Promise<Observation> {
  try {
    return leg(await call);
  } catch (err) {
    if (err instanceof RpcError) return { code: err.code, message: err.rawMessage };
    throw err;
  }
}

const never = new Promise<never>(() => {});

/** wait_refused: waits until the run completes; a lost tool call answers `waiting` every time. */
const WAIT_REFUSED_MAX_WAITS = 3;

async function* once<T>(item: T): AsyncIterable<T> {
  yield item;
}

async function* none<T>(): AsyncIterable<T> {}

const SCENARIOS: Record<string, (s: Scenario, address: string) => Promise<Observation>> = {
  async main_job(s) {
    const catalog = await s.register();
    const surface = await s.client.toolSurface(s.scope);
    const result = await s.exec(s.handlers());
    return {
      catalog,
      surface: {
        engaged: surface.codeModeEngaged,
        names: surface.tools.map((t) => t.name),
        execParameters: surface.tools[0]?.parameters ?? null,
        descriptionBytes: surface.tools.map((t) => Buffer.byteLength(t.description, "utf8")),
      },
      leg: leg(result),
      calls: s.calls,
      streamed: s.streamed,
    };
  },

  async tool_errors(s) {
    await s.register();
    return { leg: leg(await s.exec(s.handlers())), calls: s.calls };
  },

  async result_over_message_cap(s) {
    await s.register();
    return { leg: leg(await s.exec(s.handlers())), calls: s.calls };
  },

  async uncaught_refusal(s) {
    await s.register();
    return { leg: leg(await s.exec(s.handlers())), calls: s.calls };
  },

  async output_stream(s) {
    await s.register();
    return { leg: leg(await s.exec(s.handlers())), streamed: s.streamed };
  },

  async suspend_resume(s) {
    await s.register();
    const handlers = s.handlers();
    const first = await s.exec(handlers);
    if (first.status !== "waiting") throw new Error(`expected waiting: ${first.resultJson}`);
    const run = await s.client.getRun(s.scope, first.runId);
    s.gate(1).open(); // finishes between the legs: sent right after the Wait start
    const second = await s.wait(first.runId, handlers);
    return {
      first: leg(first),
      run: {
        state: run.state === 2 ? "suspended" : run.state === 1 ? "running" : "unspecified",
        snapshotStored: run.snapshotBytes > 0n,
        expires: run.expireTime !== undefined,
        pending: run.pendingToolCalls.map((p) => ({ id: p.id, method: p.method, dispatched: p.nestedCallId !== "" })),
      },
      second: leg(second),
      calls: s.calls,
      streamed: s.streamed,
    };
  },

  async yield_resume(s) {
    await s.register();
    const first = await s.exec(s.handlers());
    return { first: leg(first), second: leg(await s.wait(first.runId)) };
  },

  async cancel_message(s) {
    await s.register();
    const abort = new AbortController();
    const notices: number[] = [];
    const hold: ToolHandler = async () => {
      abort.abort(); // sends Cancel on the Exec stream
      return never;
    };
    const result = await s.exec(s.handlers({ hold }), {
      signal: abort.signal,
      onToolCallCancelled: (id) => notices.push(Number(id.slice(id.lastIndexOf("_") + 1))),
    });
    return { leg: leg(result), calls: s.calls, streamed: s.streamed, cancelNotices: notices };
  },

  async cancel_running(s) {
    await s.register();
    const cancels: Promise<string>[] = [];
    const hold: ToolHandler = async (_input, call) => {
      cancels.push(s.client.cancelRun(s.scope, call.runId));
      return never;
    };
    const result = await s.exec(s.handlers({ hold }));
    return { leg: leg(result), previousState: await Promise.all(cancels), calls: s.calls, streamed: s.streamed };
  },

  async cancel_suspended(s) {
    await s.register();
    const first = await s.exec(s.handlers());
    const previousState = await s.client.cancelRun(s.scope, first.runId);
    const cancelAgain = await s.client.cancelRun(s.scope, first.runId);
    const waited = await s.wait(first.runId);
    const after = await statusOf(s.client.getRun(s.scope, first.runId));
    return { first: leg(first), previousState, cancelAgain, wait: leg(waited), getRunAfter: after.code };
  },

  async admission(s) {
    await s.register();
    const other = { sessionId: s.scope.sessionId, agentRunId: `${s.name}-other` };
    await s.register(other);
    const refused: { code: string; message: string }[] = [];
    const hold: ToolHandler = async () => {
      refused.push(await statusOf(s.client.exec(other, { toolCallId: "call-other", code: "return 2;", handlers: {} })));
      return { details: { released: true } };
    };
    const result = await s.exec(s.handlers({ hold }));
    return { refused, leg: leg(result), calls: s.calls };
  },

  async wait_refused(s) {
    await s.register();
    let release: () => void = () => {};
    const released = new Promise<void>((resolve) => (release = resolve));
    const hold: ToolHandler = async () => {
      await released;
      return { details: { answer: "released" } };
    };
    const handlers = s.handlers({ hold });
    const first = await s.exec(handlers);
    if (first.status !== "waiting") throw new Error(`expected waiting: ${first.resultJson}`);
    const other = { sessionId: `${s.scope.sessionId}-other`, agentRunId: s.scope.agentRunId };
    const refused = await s.client.wait(other, { toolCallId: `${s.execId}-other`, runId: first.runId, handlers });
    release(); // answers while no wait is open: the result waits in the client for the owner's wait
    let waits = 0;
    let final = first;
    while (final.status === "waiting" && waits < WAIT_REFUSED_MAX_WAITS) {
      waits += 1;
      final = await s.wait(first.runId, handlers);
    }
    return { first: leg(first), refused: leg(refused), final: leg(final), waits, calls: s.calls };
  },

  async second_wait(s) {
    await s.register();
    let release: () => void = () => {};
    const released = new Promise<void>((resolve) => (release = resolve));
    let second: Observation = {};
    const hold: ToolHandler<{ step?: number }> = async (input, call) => {
      if (input.step === 1) await released;
      // Step 2 runs on the open wait's leg: a second wait on the run now must be refused and change nothing.
      else second = await legOrStatus(s.client.wait(s.scope, { toolCallId: `${s.execId}-second`, runId: call.runId }));
      return { details: { answer: `released-${input.step}` } };
    };
    const handlers = s.handlers({ hold });
    const first = await s.exec(handlers);
    if (first.status !== "waiting") throw new Error(`expected waiting: ${first.resultJson}`);
    release(); // answers between the legs: sent right after the wait's start
    const resumed = await s.wait(first.runId, handlers);
    return { first: leg(first), second, resumed: leg(resumed), calls: s.calls };
  },

  async grpc_status(s, address) {
    const blank = { sessionId: " ", agentRunId: "x" };
    const fresh = { sessionId: s.scope.sessionId, agentRunId: `${s.name}-fresh` };
    const missingRun = "run_" + "0".repeat(32);
    const out: Observation = {
      putCatalogBlankScope: await statusOf(s.client.putCatalog(blank, s.spec.tools)),
      putCatalogBadSchema: await statusOf(s.client.putCatalog(s.scope, [{ source: "host", name: "broken", parameters: { type: 12 } }])),
      getCatalogMissing: await statusOf(s.client.getCatalog(fresh)),
      listCatalogsBlankSession: await statusOf(s.client.listCatalogs("")),
      execWithoutCatalog: await statusOf(s.client.exec(fresh, { toolCallId: "call-none", code: s.program, handlers: {} })),
      getRunUnknown: await statusOf(s.client.getRun(s.scope, missingRun)),
      cancelRunUnknown: await statusOf(s.client.cancelRun(s.scope, missingRun)),
    };
    await s.register();
    // A stream whose first message is not its start: only the generated stubs can send that.
    const raw = createClient(CodeModeService, createGrpcTransport({ baseUrl: `http://${address}` }));
    const notStart = create(ToolResultSchema, { nestedCallId: "x", outcome: { case: "okJson", value: "{}" } });
    const drain = async (responses: AsyncIterable<unknown>): Promise<void> => {
      for await (const _ of responses) void _;
    };
    out["execFirstMessageNotStart"] = await statusOf(
      drain(raw.exec(once(create(ExecRequestSchema, { message: { case: "toolResult", value: notStart } })))).catch((e) => Promise.reject(rpcError(e))),
    );
    out["waitFirstMessageNotStart"] = await statusOf(
      drain(raw.wait(once(create(WaitRequestSchema, { message: { case: "toolResult", value: notStart } })))).catch((e) => Promise.reject(rpcError(e))),
    );
    out["execClosedBeforeStart"] = await statusOf(drain(raw.exec(none<ExecRequest>())).catch((e) => Promise.reject(rpcError(e))));
    out["execBadArguments"] = leg(await s.client.exec(s.scope, { toolCallId: "call-bad-args", argumentsJson: JSON.stringify({ code: 5 }), handlers: {} }));
    return out;
  },
};

async function main(argv: string[]): Promise<number> {
  const args = argv.filter((a) => !a.startsWith("--"));
  const specIndex = argv.indexOf("--spec");
  const here = dirname(fileURLToPath(import.meta.url));
  const specPath = specIndex >= 0 ? argv[specIndex + 1] : join(here, "..", "..", "conformance", "scenarios.json");
  const [name, address] = specIndex >= 0 ? args.filter((a) => a !== specPath) : args;
  const scenario = name !== undefined ? SCENARIOS[name] : undefined;
  if (scenario === undefined || address === undefined || specPath === undefined) {
    process.stderr.write(`usage: conformance.js <${Object.keys(SCENARIOS).join("|")}> <address> [--spec file]\n`);
    return 2;
  }
  const spec = JSON.parse(readFileSync(specPath, "utf8")) as Spec;
  const client = CellblockClient.connect(address);
  const s = new Scenario(client, spec, name as string);
  try {
    const observed = await scenario(s, address);
    process.stdout.write(JSON.stringify(observed) + "\n");
    return 0;
  } catch (err) {
    process.stderr.write(`conformance: ${name}: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`);
    return 1;
  } finally {
    await client.deleteCatalog(s.scope).catch(() => undefined);
    client.close();
  }
}

main(process.argv.slice(2)).then((code) => process.exit(code));
