// Tests of the client's own handling of nested calls, against an in-process gRPC server that
// stands in for cellblock (node dist/client.test.js; tests/unit/clients/test_typescript_client.py).
// Each test sends one ToolCall and checks the ToolResult the client answers with.
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { strict as assert } from "node:assert";

import { create } from "@bufbuild/protobuf";
import type { ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";

import { CellblockClient, type Handlers } from "./client.js";
import {
  CodeModeService,
  ExecResponseSchema,
  RunStatus,
  type ExecRequest,
  type ToolResult,
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
