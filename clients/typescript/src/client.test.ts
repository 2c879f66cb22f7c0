// Tests of the client's own handling of nested calls, against an in-process gRPC server that
// stands in for cellblock (node dist/client.test.js; tests/unit/clients/test_typescript_client.py).
// Each test sends ToolCalls and checks the ToolResults the client answers with; the behaviour
// against the real service is the conformance table's (tests/integration/test_client_conformance.py).
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { strict as assert } from "node:assert";

import { create } from "@bufbuild/protobuf";
import type { ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";

import { CellblockClient, type Handlers } from "./client.js";
import {
  CodeModeService,
  ErrorCode,
  ExecResponseSchema,
  RunStatus,
  WaitResponseSchema,
  type ExecRequest,
  type ToolResult,
  type WaitRequest,
} from "./gen/cellblock/v1/code_mode_service_pb.js";
import { ToolSource } from "./gen/cellblock/v1/common_pb.js";

/** Runs one exec whose single nested call is to `client:app:<name>`; returns the client's answer. */
async function answerTo(name: string, handlers: Handlers): Promise<ToolResult> {
  let answered: ToolResult | undefined;
  const routes = (router: ConnectRouter): void => {
    router.service(CodeModeService, {
      async *exec(requests: AsyncIterable<ExecRequest>) {
        const it = requests[Symbol.asyncIterator]();
        await it.next(); // the start message
        yield create(ExecResponseSchema, {
          message: {
            case: "toolCall",
            value: {
              nestedCallId: "cellblock_c1_00000000_1", runId: `run_${"0".repeat(32)}`, catalogId: `client:app:${name}`,
              source: ToolSource.CLIENT, owner: "app", name, inputJson: '{"secret":"input"}',
            },
          },
        });
        const next = await it.next();
        if (!next.done && next.value.message.case === "toolResult") answered = next.value.message.value;
        yield create(ExecResponseSchema, { message: { case: "result", value: { status: RunStatus.COMPLETED, resultJson: "{}" } } });
      },
    });
  };
  const server = http2.createServer(connectNodeAdapter({ routes }));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const client = CellblockClient.connect(`127.0.0.1:${(server.address() as AddressInfo).port}`);
  try {
    await client.exec({ sessionId: "s", agentRunId: "r" }, { toolCallId: "c1", code: "return 1;", handlers });
  } finally {
    client.close();
    server.close();
  }
  assert.ok(answered, "the client sent no ToolResult");
  return answered;
}

/** Serves `routes` on a local port for the duration of `body`. */
async function serving(routes: (router: ConnectRouter) => void, body: (client: CellblockClient) => Promise<void>): Promise<void> {
  const server = http2.createServer(connectNodeAdapter({ routes }));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const client = CellblockClient.connect(`127.0.0.1:${(server.address() as AddressInfo).port}`);
  try {
    await body(client);
  } finally {
    client.close();
    server.close();
  }
}

/** The next request's ToolResult, or undefined when none comes within `ms`. */
async function nextToolResult(it: AsyncIterator<WaitRequest>, ms: number): Promise<ToolResult | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), ms)));
  const next = await Promise.race([it.next(), timeout]);
  clearTimeout(timer);
  return next !== undefined && !next.done && next.value.message.case === "toolResult" ? next.value.message.value : undefined;
}

const W06 = "this run is already being resumed by another wait; let that call return first.";

const tests: Record<string, () => Promise<void>> = {
  // Tool names are free text: ones that are also Object.prototype members have no handler unless
  // one is registered, and are answered like any other unserved tool.
  async "tools named like Object.prototype members have no handler by default"() {
    for (const name of ["constructor", "toString", "hasOwnProperty", "__proto__", "valueOf"]) {
      const r = await answerTo(name, {});
      assert.equal(r.outcome.case, "error", `${name}: ${JSON.stringify(r.outcome.value)}`);
      assert.equal(r.outcome.value.message, `no handler registered for client:app:${name}`);
    }
  },
  async "a handler registered under such a name serves it"() {
    const r = await answerTo("constructor", { constructor: () => ({ details: { served: true } }) });
    assert.equal(r.outcome.case, "okJson");
    assert.deepEqual(JSON.parse(r.outcome.value), { details: { served: true } });
  },
  // Two waits on one run race; the service lets the later one resume the run and refuses the
  // earlier one with [W06] (SPEC §5.2 item 5), after the client wrote the run's result on it.
  // The refusal must hand that result, and the run, to the wait still open.
  async "a refused earlier wait hands the run to the later wait that resumes it"() {
    const runId = `run_${"1".repeat(32)}`;
    let resumedCalled: () => void = () => {};
    const called = new Promise<void>((resolve) => (resumedCalled = resolve));
    const answered: { [wait: string]: ToolResult | undefined } = {};
    const routes = (router: ConnectRouter): void => {
      router.service(CodeModeService, {
        async *wait(requests: AsyncIterable<WaitRequest>) {
          const it = requests[Symbol.asyncIterator]();
          const start = await it.next();
          const wait = !start.done && start.value.message.case === "start" ? start.value.message.value.toolCallId : "";
          if (wait === "earlier") {
            await called;
            answered[wait] = await nextToolResult(it, 1000);
            const body = { status: "failed", error: W06, code: "invalid_input", failurePhase: "input" };
            yield create(WaitResponseSchema, {
              message: { case: "result", value: { status: RunStatus.FAILED, code: ErrorCode.INVALID_INPUT, resultJson: JSON.stringify(body) } },
            });
            return;
          }
          yield create(WaitResponseSchema, {
            message: {
              case: "toolCall",
              value: { nestedCallId: "cellblock_c1_00000000_2", runId, catalogId: "client:app:lookup", source: ToolSource.CLIENT, owner: "app", name: "lookup", inputJson: "{}" },
            },
          });
          resumedCalled();
          answered[wait] = await nextToolResult(it, 5000);
          const status = answered[wait] !== undefined ? RunStatus.COMPLETED : RunStatus.WAITING;
          yield create(WaitResponseSchema, { message: { case: "result", value: { status, runId, resultJson: "{}" } } });
        },
      });
    };
    await serving(routes, async (client) => {
      const scope = { sessionId: "s", agentRunId: "r" };
      const handlers: Handlers = { lookup: () => ({ details: { found: true } }) };
      const earlier = client.wait(scope, { toolCallId: "earlier", runId, handlers });
      const later = client.wait(scope, { toolCallId: "later", runId, handlers });
      const [refused, resumed] = await Promise.all([earlier, later]);
      assert.equal(refused.body.error, W06);
      assert.equal(resumed.status, "completed", "the resuming wait never got the run's result");
      assert.equal(answered["later"]?.outcome.case, "okJson");
    });
  },
};

let failed = 0;
for (const [name, test] of Object.entries(tests)) {
  try {
    await test();
    process.stdout.write(`ok   ${name}\n`);
  } catch (err) {
    failed += 1;
    process.stdout.write(`FAIL ${name}\n${err instanceof Error ? err.stack ?? err.message : String(err)}\n`);
  }
}
process.exit(failed === 0 ? 0 : 1);
