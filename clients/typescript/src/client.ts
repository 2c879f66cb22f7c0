// TypeScript client of cellblock over the gRPC protocol of @connectrpc/connect-node.
//
// The message and service types come from src/gen (buf generate, protoc-gen-es v2, from
// ../../proto/cellblock/v1). This module adds what every runtime needs on top of them:
// catalogs from SPEC §3.2 tool objects, exec/wait legs whose nested calls are served by
// typed handlers (each on its own promise), results of calls that settle after a leg
// returned `waiting` delivered on the run's next `wait` stream (SPEC §3.4 item 3), and
// cancellation by `Cancel` message (an AbortSignal) or RunService.CancelRun.
//
//   const client = CellblockClient.connect("127.0.0.1:50051");
//   await client.putCatalog(scope, tools);
//   let result = await client.exec(scope, { toolCallId: "call_1", code, handlers });
//   while (result.status === "waiting") {
//     result = await client.wait(scope, { toolCallId: "call_2", runId: result.runId, handlers });
//   }
//   reply(result.resultJson); // the model-facing result, verbatim
import * as net from "node:net";

import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import {
  CatalogService,
  McpOperation,
  PutCatalogRequestSchema,
  RegistrationMode,
  ToolSchema,
  type Catalog,
  type Tool,
} from "./gen/cellblock/v1/catalog_service_pb.js";
import {
  CodeModeService,
  ErrorCode,
  ExecRequestSchema,
  LimitOverridesSchema,
  NestedCallMethod,
  RunStatus,
  ToolErrorKind,
  ToolResultSchema,
  WaitRequestSchema,
  type ExecRequest,
  type ExecResponse,
  type Result,
  type RunMetadata,
  type ToolCall,
  type ToolResult,
  type WaitRequest,
  type WaitResponse,
} from "./gen/cellblock/v1/code_mode_service_pb.js";
import { ScopeSchema, ToolSource, type Scope } from "./gen/cellblock/v1/common_pb.js";
import { RunService, RunState, type Run } from "./gen/cellblock/v1/run_service_pb.js";

export type { Catalog, Run, RunMetadata, Scope };

/** A JSON value as it crosses the API (tool inputs, tool results, program values). */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };
/** A JSON object. */
export type JsonObject = { [key: string]: JsonValue };

/** A scope: one agent run inside one session (both required, non-empty). */
export interface ScopeLike {
  sessionId: string;
  agentRunId: string;
}

/** One tool as SPEC §3.2 writes it (camelCase; schemas as objects). */
export interface ToolSpec {
  source: "host" | "mcp" | "client";
  owner?: string;
  name: string;
  label?: string;
  description?: string;
  parameters?: JsonObject;
  outputSchema?: JsonObject;
  replaySafe?: boolean;
  sideEffecting?: boolean;
  directOnly?: boolean;
  operation?: "tool" | "resources.list" | "resources.read" | "prompts.list" | "prompts.get";
}

/** The kinds of a refused or failed nested call (SPEC §3.5 item 5). */
export type ToolErrorKindName = "invalid_input" | "blocked" | "failed" | "cancelled";

/** The context of one nested call, passed to its handler next to the input. */
export interface ToolCallInfo {
  /** `cellblock_<P>_<R>_<n>`, unique within the run. */
  nestedCallId: string;
  /** The tool-call id of the run's exec, in every leg. */
  parentToolCallId: string;
  /** `run_` plus 32 lower-case hex digits. */
  runId: string;
  /** `replay_` plus 24 lower-case hex digits. */
  replayId: string;
  /** The resolved catalog id, e.g. `host:core:lookup`. */
  catalogId: string;
  source: "host" | "mcp" | "client" | "unspecified";
  owner: string;
  name: string;
  method: "call" | "callValue" | "namespace" | "unspecified";
  /** Aborted when cellblock abandons the call (tool_call_cancelled) or the run ends. */
  signal: AbortSignal;
}

/**
 * A tool handler: receives the parsed input, returns the tool result (normally
 * `{ content?, details? }`), sent as JSON. Throwing `ToolRefusal` sends that kind and
 * message; any other throw sends kind `failed` with the error's message.
 */
export type ToolHandler<I = JsonObject, O = JsonValue> = (input: I, call: ToolCallInfo) => O | Promise<O>;

/** Handlers keyed by catalog id (preferred) or tool name. */
export type Handlers = { readonly [idOrName: string]: ToolHandler<any, any> };

/** Thrown by a handler to answer its call with an error of a given kind. */
export class ToolRefusal extends Error {
  constructor(
    readonly kind: ToolErrorKindName,
    message: string,
  ) {
    super(message);
    this.name = "ToolRefusal";
  }
}

/** A gRPC call failed; `code` is the canonical status name, e.g. `NOT_FOUND`. */
export class RpcError extends Error {
  constructor(
    readonly code: string,
    readonly rawMessage: string,
  ) {
    super(rawMessage ? `${code}: ${rawMessage}` : code);
    this.name = "RpcError";
  }
}

/** One output entry (SPEC §10.5 `OutputEntry`). */
export type OutputEntry =
  | { type: "text"; text: string }
  | { type: "json"; value: JsonValue }
  | { type: "truncated"; truncated: true; omittedBytes: number; omittedEntries: number; guidance: string; prefix: string };

/** The outcome of one leg. A failed run is a value: check `status`. */
export interface RunResult {
  status: "completed" | "waiting" | "failed";
  /** Failed only: e.g. `invalid_input`, `aborted`; `""` otherwise. */
  code: string;
  /** The model-facing result object (SPEC §10.5), parsed. */
  body: JsonObject;
  /** The model-facing result as the service sent it; return it to the model verbatim. */
  resultJson: string;
  /** Waiting only: the id to pass to `wait`. */
  runId: string;
  traceId: string;
  metadata: { bridgeCalls: { search: number; describe: number; call: number }; legCount: number; snapshotBytes: number; cellId: string };
}

/** Options of one exec or wait leg. */
export interface LegOptions {
  handlers?: Handlers;
  /** Called with each output entry as the service accepts it. */
  onOutput?: (entry: OutputEntry) => void;
  /** Aborting sends `Cancel`; the leg still returns its `aborted` result (SPEC §3.6 item 1). */
  signal?: AbortSignal;
  /** Called when cellblock abandons a dispatched call (its handler's signal is aborted too). */
  onToolCallCancelled?: (nestedCallId: string) => void;
}

/** Options of `exec`: pass `code` or the model's `argumentsJson`, verbatim. */
export interface ExecOptions extends LegOptions {
  toolCallId: string;
  code?: string;
  argumentsJson?: string;
  turnId?: string;
  forceRestartSafe?: boolean;
  limits?: { timeoutMs?: number; memoryLimitBytes?: number; maxOutputBytes?: number; maxSnapshotBytes?: number; maxPendingToolCalls?: number; snapshotTtlSeconds?: number };
}

/** Options of `wait`: pass `runId` or the model's `argumentsJson`, verbatim. */
export interface WaitOptions extends LegOptions {
  toolCallId: string;
  runId?: string;
  argumentsJson?: string;
}

const CANCEL_REASON = "client cancelled the leg";
/** The service's gRPC message cap in bytes (SPEC §2.3, §3.5 item 5); a larger result goes as `oversizedBytes`. */
export const MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
/** Room kept for the ToolResult's own fields (nested call id, framing). */
const TOOL_RESULT_ENVELOPE_BYTES = 4096;
const STATUS_NAMES = [
  "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
  "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
  "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
] as const;
const SOURCES = { host: ToolSource.HOST, mcp: ToolSource.MCP, client: ToolSource.CLIENT } as const;
const OPERATIONS = {
  tool: McpOperation.TOOL,
  "resources.list": McpOperation.RESOURCES_LIST,
  "resources.read": McpOperation.RESOURCES_READ,
  "prompts.list": McpOperation.PROMPTS_LIST,
  "prompts.get": McpOperation.PROMPTS_GET,
} as const;
const KINDS = {
  invalid_input: ToolErrorKind.INVALID_INPUT,
  blocked: ToolErrorKind.BLOCKED,
  failed: ToolErrorKind.FAILED,
  cancelled: ToolErrorKind.CANCELLED,
} as const;
const RUN_STATUSES: Record<number, RunResult["status"]> = {
  [RunStatus.COMPLETED]: "completed",
  [RunStatus.WAITING]: "waiting",
  [RunStatus.FAILED]: "failed",
};
const ERROR_CODES: Record<number, string> = {
  [ErrorCode.INVALID_INPUT]: "invalid_input",
  [ErrorCode.RUNTIME_UNAVAILABLE]: "runtime_unavailable",
  [ErrorCode.ABORTED]: "aborted",
  [ErrorCode.TIMEOUT]: "timeout",
  [ErrorCode.OUTPUT_LIMIT_EXCEEDED]: "output_limit_exceeded",
  [ErrorCode.SNAPSHOT_LIMIT_EXCEEDED]: "snapshot_limit_exceeded",
  [ErrorCode.INTERNAL_ERROR]: "internal_error",
};
const RUN_STATES: Record<number, "running" | "suspended"> = { [RunState.RUNNING]: "running", [RunState.SUSPENDED]: "suspended" };

/** Converts a connect error (or anything thrown by a call) to `RpcError`. */
export function rpcError(err: unknown): RpcError {
  if (err instanceof RpcError) return err;
  const ce = ConnectError.from(err);
  return new RpcError(STATUS_NAMES[ce.code] ?? Code[ce.code] ?? "UNKNOWN", ce.rawMessage);
}

/** An async queue a stream reads its requests from. */
class Pushable<T> implements AsyncIterable<T> {
  private items: T[] = [];
  private waiter: (() => void) | null = null;
  private ended = false;

  push(item: T): boolean {
    if (this.ended) return false;
    this.items.push(item);
    this.wake();
    return true;
  }

  end(): void {
    this.ended = true;
    this.wake();
  }

  get open(): boolean {
    return !this.ended;
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = null;
    w?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    for (;;) {
      const item = this.items.shift();
      if (item !== undefined) {
        yield item;
        continue;
      }
      if (this.ended) return;
      await new Promise<void>((resolve) => (this.waiter = resolve));
    }
  }
}

/** One open exec or wait stream, as the runs it serves see it. */
interface Leg {
  /** Writes a result on the stream; false once the stream has ended. */
  send(r: ToolResult): boolean;
  /** Results written on this leg (resent if it suspends or is refused: repeats are ignored). */
  sent: ToolResult[];
}

/** The nested calls of one run this client is serving, across its legs. */
class RunCalls {
  readonly inFlight = new Map<string, AbortController>();
  /** Results finished while no leg of the run was open. */
  undelivered: ToolResult[] = [];
  /**
   * The run's open legs, oldest first; results go out on the first. Two are open when a
   * second wait races the one serving the run: the service refuses one of them (SPEC §5.2
   * item 5, [W06]), and the refusal hands the run to the other, never away from it.
   */
  legs: Leg[] = [];

  constructor(readonly runId: string) {}

  abandonAll(): void {
    for (const ctl of this.inFlight.values()) ctl.abort();
    this.inFlight.clear();
    this.undelivered = [];
    for (const leg of this.legs) leg.sent = [];
  }
}

type LegRequest = ExecRequest | WaitRequest;
type LegResponse = ExecResponse | WaitResponse;

/** Async client of the cellblock services (CatalogService, CodeModeService, RunService). */
export class CellblockClient {
  private readonly catalogs: Client<typeof CatalogService>;
  private readonly codeMode: Client<typeof CodeModeService>;
  private readonly runService: Client<typeof RunService>;
  private readonly runs = new Map<string, RunCalls>();

  private constructor(
    target: string,
    private readonly rpcTimeoutMs: number,
  ) {
    const unix = target.startsWith("unix:") ? target.slice("unix:".length) : null;
    const transport = createGrpcTransport({
      baseUrl: unix !== null ? "http://localhost" : `http://${target}`,
      ...(unix !== null ? { nodeOptions: { createConnection: () => net.connect(unix) } } : {}),
    });
    this.catalogs = createClient(CatalogService, transport);
    this.codeMode = createClient(CodeModeService, transport);
    this.runService = createClient(RunService, transport);
  }

  /**
   * Creates a client for `host:port` or `unix:/path` (plaintext HTTP/2). Connections are
   * opened lazily by the first call.
   */
  static connect(target: string, options: { rpcTimeoutMs?: number } = {}): CellblockClient {
    return new CellblockClient(target, options.rpcTimeoutMs ?? 60_000);
  }

  private async unary<T>(call: (opts: { timeoutMs: number }) => Promise<T>): Promise<T> {
    try {
      return await call({ timeoutMs: this.rpcTimeoutMs });
    } catch (err) {
      throw rpcError(err);
    }
  }

  /** Registers (`replace`, default) or extends (`merge`) the scope's catalog. All-or-nothing. */
  async putCatalog(
    scope: ScopeLike,
    tools: readonly ToolSpec[],
    options: { mode?: "replace" | "merge"; directToolNames?: string[]; allow?: string[]; deny?: string[] } = {},
  ): Promise<Catalog> {
    const request = create(PutCatalogRequestSchema, {
      scope: toScope(scope),
      tools: tools.map(toTool),
      mode: options.mode === "merge" ? RegistrationMode.MERGE : RegistrationMode.REPLACE,
      directToolNames: options.directToolNames ?? [],
      allow: options.allow ?? [],
      deny: options.deny ?? [],
    });
    const response = await this.unary((o) => this.catalogs.putCatalog(request, o));
    if (!response.catalog) throw new RpcError("INTERNAL", "PutCatalog returned no catalog");
    return response.catalog;
  }

  /** Returns the scope's catalog; `NOT_FOUND` when it has none. */
  async getCatalog(scope: ScopeLike): Promise<Catalog> {
    const response = await this.unary((o) => this.catalogs.getCatalog({ scope: toScope(scope) }, o));
    if (!response.catalog) throw new RpcError("INTERNAL", "GetCatalog returned no catalog");
    return response.catalog;
  }

  /** Lists one page of a session's catalogs. */
  async listCatalogs(sessionId: string, pageSize = 0, pageToken = "") {
    return this.unary((o) => this.catalogs.listCatalogs({ sessionId, pageSize, pageToken }, o));
  }

  /** Ends the scope: aborts its legs, discards its suspended runs, drops the catalog. */
  async deleteCatalog(scope: ScopeLike): Promise<{ abortedLegs: number; discardedRuns: number }> {
    const r = await this.unary((o) => this.catalogs.deleteCatalog({ scope: toScope(scope) }, o));
    return { abortedLegs: r.abortedLegs, discardedRuns: r.discardedRuns };
  }

  /** The model-visible tools of a scope (SPEC §3.3); parameters parsed from JSON. */
  async toolSurface(scope: ScopeLike, modelId = ""): Promise<{ codeModeEngaged: boolean; tools: { name: string; description: string; parameters: JsonObject }[] }> {
    const r = await this.unary((o) => this.codeMode.getToolSurface({ scope: toScope(scope), modelId }, o));
    return {
      codeModeEngaged: r.codeModeEngaged,
      tools: r.tools.map((t) => ({ name: t.name, description: t.description, parameters: parseObject(t.parametersJson) })),
    };
  }

  /** Runs one `exec` leg and serves its nested calls. */
  async exec(scope: ScopeLike, options: ExecOptions): Promise<RunResult> {
    if ((options.code === undefined) === (options.argumentsJson === undefined)) {
      throw new TypeError("pass exactly one of code and argumentsJson");
    }
    const start = {
      scope: toScope(scope),
      toolCallId: options.toolCallId,
      argumentsJson: options.argumentsJson ?? JSON.stringify({ code: options.code }),
      turnId: options.turnId ?? "",
      forceRestartSafe: options.forceRestartSafe ?? false,
      ...(options.limits ? { limitOverrides: create(LimitOverridesSchema, toLimits(options.limits)) } : {}),
    };
    const requests = new Pushable<ExecRequest>();
    requests.push(create(ExecRequestSchema, { message: { case: "start", value: start } }));
    return this.runLeg(
      requests,
      () => this.codeMode.exec(requests),
      {
        toolResult: (value) => create(ExecRequestSchema, { message: { case: "toolResult", value } }),
        cancel: () => create(ExecRequestSchema, { message: { case: "cancel", value: { reason: CANCEL_REASON } } }),
      },
      null,
      options,
    );
  }

  /** Runs one `wait` leg; results of calls dispatched in earlier legs go out on it as they settle. */
  async wait(scope: ScopeLike, options: WaitOptions): Promise<RunResult> {
    if ((options.runId === undefined) === (options.argumentsJson === undefined)) {
      throw new TypeError("pass exactly one of runId and argumentsJson");
    }
    let runId = options.runId ?? "";
    if (options.argumentsJson !== undefined) {
      const parsed = safeParse(options.argumentsJson);
      runId = isObject(parsed) && typeof parsed["runId"] === "string" ? parsed["runId"] : "";
    }
    const start = {
      scope: toScope(scope),
      toolCallId: options.toolCallId,
      argumentsJson: options.argumentsJson ?? JSON.stringify({ runId }),
    };
    const requests = new Pushable<WaitRequest>();
    requests.push(create(WaitRequestSchema, { message: { case: "start", value: start } }));
    return this.runLeg(
      requests,
      () => this.codeMode.wait(requests),
      {
        toolResult: (value) => create(WaitRequestSchema, { message: { case: "toolResult", value } }),
        cancel: () => create(WaitRequestSchema, { message: { case: "cancel", value: { reason: CANCEL_REASON } } }),
      },
      runId || null,
      options,
    );
  }

  /** Returns one run of the scope; `NOT_FOUND` when unknown, expired or another scope's. */
  async getRun(scope: ScopeLike, runId: string): Promise<Run> {
    const r = await this.unary((o) => this.runService.getRun({ scope: toScope(scope), runId }, o));
    if (!r.run) throw new RpcError("INTERNAL", "GetRun returned no run");
    return r.run;
  }

  /** Lists one page of the scope's running and suspended runs. */
  async listRuns(scope: ScopeLike, pageSize = 0, pageToken = "") {
    return this.unary((o) => this.runService.listRuns({ scope: toScope(scope), pageSize, pageToken }, o));
  }

  /** Aborts an active leg or discards a suspended run; returns the state it was in. */
  async cancelRun(scope: ScopeLike, runId: string): Promise<"running" | "suspended" | "unspecified"> {
    const r = await this.unary((o) => this.runService.cancelRun({ scope: toScope(scope), runId }, o));
    this.runs.get(runId)?.abandonAll();
    this.runs.delete(runId);
    return RUN_STATES[r.previousState] ?? "unspecified";
  }

  /** Abandons every nested call this client still serves. */
  close(): void {
    for (const run of this.runs.values()) run.abandonAll();
    this.runs.clear();
  }

  // -- legs ------------------------------------------------------------------

  private async runLeg<Req extends LegRequest>(
    requests: Pushable<Req>,
    open: () => AsyncIterable<LegResponse>,
    make: { toolResult: (r: ToolResult) => Req; cancel: () => Req },
    waitRunId: string | null,
    options: LegOptions,
  ): Promise<RunResult> {
    const leg: Leg = { send: (r) => requests.push(make.toolResult(r)), sent: [] };
    let run: RunCalls | null = waitRunId !== null ? this.attach(waitRunId, leg) : null;
    const onAbort = (): void => {
      requests.push(make.cancel());
    };
    if (options.signal?.aborted) onAbort();
    options.signal?.addEventListener("abort", onAbort, { once: true });
    try {
      for await (const msg of open()) {
        const m = msg.message;
        if (m.case === "toolCall") {
          if (run === null || run.runId !== m.value.runId) run = this.attach(m.value.runId, leg);
          this.dispatch(run, m.value, options.handlers ?? {});
        } else if (m.case === "output") {
          options.onOutput?.(JSON.parse(m.value.entryJson) as OutputEntry);
        } else if (m.case === "toolCallCancelled") {
          const id = m.value.nestedCallId;
          options.onToolCallCancelled?.(id);
          for (const r of [run, ...this.runs.values()]) {
            const ctl = r?.inFlight.get(id);
            if (r && ctl) {
              ctl.abort();
              r.inFlight.delete(id);
              break;
            }
          }
        } else if (m.case === "result") {
          const result = toRunResult(m.value);
          this.endLeg(run ?? this.runs.get(result.runId) ?? null, leg, result, waitRunId !== null && refusedBeforeTheRun(result));
          requests.end();
          return result;
        }
      }
      throw new RpcError("INTERNAL", "the service closed the stream without a Result");
    } catch (err) {
      // A stream that failed while another leg of its run is open (a second wait refused with
      // a status, e.g. RESOURCE_EXHAUSTED) leaves the run to that leg; else the run ends here.
      if (run !== null && this.detach(run, leg) === 0) {
        run.abandonAll();
        this.runs.delete(run.runId);
      }
      throw rpcError(err);
    } finally {
      options.signal?.removeEventListener("abort", onAbort);
      requests.end();
    }
  }

  /** Adds a leg to its run's open legs; the run's kept results go out on it if it is the only one. */
  private attach(runId: string, leg: Leg): RunCalls {
    let run = this.runs.get(runId);
    if (run === undefined) {
      run = new RunCalls(runId);
      this.runs.set(runId, run);
    }
    if (!run.legs.includes(leg)) {
      run.legs.push(leg);
      if (run.legs.length === 1) this.flush(run);
    }
    return run;
  }

  /**
   * Removes an ended leg from its run: what it carried is kept for the run's next leg (it may
   * have missed the run), and goes out at once on the run's next open leg, if any. Returns
   * how many legs of the run are still open.
   */
  private detach(run: RunCalls, leg: Leg): number {
    const at = run.legs.indexOf(leg);
    if (at < 0) return run.legs.length;
    run.legs.splice(at, 1);
    run.undelivered = [...leg.sent, ...run.undelivered];
    leg.sent = [];
    if (run.legs.length > 0) this.flush(run);
    return run.legs.length;
  }

  private flush(run: RunCalls): void {
    const backlog = run.undelivered;
    run.undelivered = [];
    for (const r of backlog) this.deliver(run, r);
  }

  /**
   * Ends a leg on its Result: keeps, or aborts and drops, its run's handlers. A wait the
   * service refused before it touched the run (`refusedWait`: SPEC §5.2, such a refusal
   * changes nothing) keeps them, and what its leg carried goes out on the next wait.
   */
  private endLeg(run: RunCalls | null, leg: Leg, result: RunResult, refusedWait: boolean): void {
    if (run === null) return;
    if (result.status === "waiting" || refusedWait) {
      // Results written just before the service parked (or to a refused wait) may have missed the run.
      const open = this.detach(run, leg);
      if (open === 0 && run.inFlight.size === 0 && run.undelivered.length === 0) this.runs.delete(run.runId);
    } else {
      run.abandonAll();
      this.runs.delete(run.runId);
    }
  }

  private deliver(run: RunCalls, result: ToolResult): void {
    const leg = run.legs[0];
    if (leg !== undefined && leg.send(result)) {
      leg.sent.push(result);
    } else if (this.runs.get(run.runId) === run) {
      run.undelivered.push(result);
    }
  }

  private dispatch(run: RunCalls, tc: ToolCall, handlers: Handlers): void {
    if (run.inFlight.has(tc.nestedCallId)) return;
    const ctl = new AbortController();
    run.inFlight.set(tc.nestedCallId, ctl);
    const info = toCallInfo(tc, ctl.signal);
    // Own keys only: a tool named "constructor" or "toString" must not find Object.prototype's.
    const own = (key: string): ToolHandler<any, any> | undefined => (Object.hasOwn(handlers, key) ? handlers[key] : undefined);
    const handler = own(tc.catalogId) ?? own(tc.name);
    void invoke(handler, tc.inputJson, info).then((result) => {
      if (run.inFlight.get(tc.nestedCallId) !== ctl) return; // abandoned
      run.inFlight.delete(tc.nestedCallId);
      this.deliver(run, result);
    });
  }
}

async function invoke(handler: ToolHandler<any, any> | undefined, inputJson: string, info: ToolCallInfo): Promise<ToolResult> {
  if (handler === undefined) return errorResult(info.nestedCallId, "failed", `no handler registered for ${info.catalogId}`);
  try {
    const input = inputJson ? (JSON.parse(inputJson) as JsonValue) : {};
    const value: unknown = await handler(input, info);
    const okJson = JSON.stringify(value ?? null);
    if (okJson === undefined) return errorResult(info.nestedCallId, "failed", "the tool result is not JSON-serialisable");
    const size = Buffer.byteLength(okJson, "utf8");
    if (size + TOOL_RESULT_ENVELOPE_BYTES > MAX_MESSAGE_BYTES) {
      // gRPC would end the whole stream for an oversized message; the guest gets B12 instead.
      return create(ToolResultSchema, { nestedCallId: info.nestedCallId, outcome: { case: "oversizedBytes", value: BigInt(size) } });
    }
    return create(ToolResultSchema, { nestedCallId: info.nestedCallId, outcome: { case: "okJson", value: okJson } });
  } catch (err) {
    if (err instanceof ToolRefusal) return errorResult(info.nestedCallId, err.kind, err.message);
    const message = err instanceof Error ? err.message || err.name : String(err);
    return errorResult(info.nestedCallId, "failed", message);
  }
}

function errorResult(nestedCallId: string, kind: ToolErrorKindName, message: string): ToolResult {
  return {
    $typeName: "cellblock.v1.ToolResult",
    nestedCallId,
    outcome: { case: "error", value: { $typeName: "cellblock.v1.ToolError", kind: KINDS[kind], message } },
  };
}

function toScope(scope: ScopeLike): Scope {
  return create(ScopeSchema, { sessionId: scope.sessionId, agentRunId: scope.agentRunId });
}

function toTool(spec: ToolSpec): Tool {
  return create(ToolSchema, {
    source: SOURCES[spec.source],
    owner: spec.owner ?? "",
    name: spec.name,
    label: spec.label ?? "",
    description: spec.description ?? "",
    parametersJson: spec.parameters !== undefined ? JSON.stringify(spec.parameters) : "",
    outputSchemaJson: spec.outputSchema !== undefined ? JSON.stringify(spec.outputSchema) : "",
    replaySafe: spec.replaySafe ?? false,
    sideEffecting: spec.sideEffecting ?? false,
    directOnly: spec.directOnly ?? false,
    operation: spec.operation !== undefined ? OPERATIONS[spec.operation] : McpOperation.UNSPECIFIED,
  });
}

function toLimits(limits: NonNullable<ExecOptions["limits"]>) {
  const big = (v: number | undefined): bigint | undefined => (v === undefined ? undefined : BigInt(v));
  return {
    timeoutMs: big(limits.timeoutMs),
    memoryLimitBytes: big(limits.memoryLimitBytes),
    maxOutputBytes: big(limits.maxOutputBytes),
    maxSnapshotBytes: big(limits.maxSnapshotBytes),
    maxPendingToolCalls: big(limits.maxPendingToolCalls),
    snapshotTtlSeconds: big(limits.snapshotTtlSeconds),
  };
}

function toCallInfo(tc: ToolCall, signal: AbortSignal): ToolCallInfo {
  const sources: Record<number, ToolCallInfo["source"]> = { [ToolSource.HOST]: "host", [ToolSource.MCP]: "mcp", [ToolSource.CLIENT]: "client" };
  const methods: Record<number, ToolCallInfo["method"]> = {
    [NestedCallMethod.CALL]: "call",
    [NestedCallMethod.CALL_VALUE]: "callValue",
    [NestedCallMethod.NAMESPACE]: "namespace",
  };
  return {
    nestedCallId: tc.nestedCallId,
    parentToolCallId: tc.parentToolCallId,
    runId: tc.runId,
    replayId: tc.replayId,
    catalogId: tc.catalogId,
    source: sources[tc.source] ?? "unspecified",
    owner: tc.owner,
    name: tc.name,
    method: methods[tc.method] ?? "unspecified",
    signal,
  };
}

/**
 * Whether a wait's result refuses the wait itself, not an end of its run: the service answers
 * a wait it cannot serve (bad input, an unknown run, another scope's run, a run another wait
 * resumes) with `invalid_input` in the `input` phase, before any cell work (SPEC §5.2).
 */
function refusedBeforeTheRun(result: RunResult): boolean {
  return result.status === "failed" && result.code === "invalid_input" && result.body.failurePhase === "input";
}

function toRunResult(r: Result): RunResult {
  const md: RunMetadata | undefined = r.metadata;
  return {
    status: RUN_STATUSES[r.status] ?? "failed",
    code: ERROR_CODES[r.code] ?? "",
    body: parseObject(r.resultJson),
    resultJson: r.resultJson,
    runId: r.runId,
    traceId: r.traceId,
    metadata: {
      bridgeCalls: {
        search: Number(md?.bridgeCalls?.search ?? 0n),
        describe: Number(md?.bridgeCalls?.describe ?? 0n),
        call: Number(md?.bridgeCalls?.call ?? 0n),
      },
      legCount: md?.legCount ?? 0,
      snapshotBytes: Number(md?.snapshotBytes ?? 0n),
      cellId: md?.cellId ?? "",
    },
  };
}

function safeParse(text: string): JsonValue | undefined {
  try {
    return JSON.parse(text) as JsonValue;
  } catch {
    return undefined;
  }
}

function isObject(v: JsonValue | undefined): v is JsonObject {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function parseObject(text: string): JsonObject {
  const v = safeParse(text);
  return isObject(v) ? v : {};
}
