#!/usr/bin/env node
// Interop client for cellblock, built ONLY from the .proto files in proto/
// (loaded at run time with @grpc/proto-loader, no generated code, no Python).
//
// It registers the example catalog (examples/catalog.json, the same file the
// Python examples read), runs one program (default examples/programs/shipment.js)
// through CodeModeService.Exec, answers every ToolCall with a JavaScript
// handler, and prints the final Result.result_json as ONE JSON line on stdout.
// Diagnostics go to stderr. Exit codes: 0 result printed, 1 RPC/protocol error,
// 2 bad usage.
//
// Usage:
//   node tests/interop/exec_client.js --target unix:/tmp/cellblock.sock
//   node tests/interop/exec_client.js --target 127.0.0.1:50051 \
//     [--program examples/programs/shipment.js] [--catalog examples/catalog.json] \
//     [--owners shipping,billing | --owners all] [--session S] [--agent-run A] \
//     [--tool-call-id ID] [--timeout-ms N] [--metadata]
//
// --metadata prints one JSON object {result, status, code, runId, traceId,
// metadata, toolCalls} instead of the bare result_json (still one line).
'use strict';

const fs = require('fs');
const path = require('path');
const crypto = require('crypto');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const REPO = path.resolve(__dirname, '..', '..');

function usage(message) {
  if (message) process.stderr.write(`exec_client: ${message}\n`);
  process.stderr.write(
    'usage: exec_client.js --target <unix:/path | host:port> [--program file.js] [--catalog catalog.json]\n' +
      '       [--owners all|a,b] [--session id] [--agent-run id] [--tool-call-id id] [--timeout-ms n] [--metadata]\n',
  );
  process.exit(2);
}

function parseArgs(argv) {
  const opts = {
    target: null,
    program: path.join(REPO, 'examples', 'programs', 'shipment.js'),
    catalog: path.join(REPO, 'examples', 'catalog.json'),
    owners: 'all',
    session: `interop-${process.pid}`,
    agentRun: `run-${crypto.randomBytes(4).toString('hex')}`,
    toolCallId: 'call_interop_1',
    timeoutMs: 60000,
    metadata: false,
    protoRoot: path.join(REPO, 'proto'),
  };
  const flags = {
    '--target': 'target',
    '--program': 'program',
    '--catalog': 'catalog',
    '--owners': 'owners',
    '--session': 'session',
    '--agent-run': 'agentRun',
    '--tool-call-id': 'toolCallId',
    '--timeout-ms': 'timeoutMs',
    '--proto-root': 'protoRoot',
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--help' || arg === '-h') usage();
    if (arg === '--metadata') {
      opts.metadata = true;
      continue;
    }
    const [flag, inline] = arg.includes('=') ? arg.split(/=(.*)/s, 2) : [arg, undefined];
    const key = flags[flag];
    if (!key) usage(`unknown argument ${arg}`);
    const value = inline !== undefined ? inline : argv[++i];
    if (value === undefined) usage(`${flag} needs a value`);
    opts[key] = value;
  }
  if (!opts.target) usage('--target is required');
  opts.timeoutMs = Number(opts.timeoutMs);
  if (!Number.isFinite(opts.timeoutMs) || opts.timeoutMs <= 0) usage('--timeout-ms must be a positive number');
  return opts;
}

function loadServices(protoRoot) {
  const files = ['catalog_service.proto', 'code_mode_service.proto', 'run_service.proto'].map((f) =>
    path.join('cellblock', 'v1', f),
  );
  const definition = protoLoader.loadSync(files, {
    includeDirs: [protoRoot],
    keepCase: true, // field names exactly as in the .proto files
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true, // adds the virtual `message` / `outcome` oneof fields
  });
  const pkg = grpc.loadPackageDefinition(definition).cellblock.v1;
  return { CatalogService: pkg.CatalogService, CodeModeService: pkg.CodeModeService };
}

// SPEC §3.2 registration shape (camelCase JSON) -> cellblock.v1.Tool.
function toProtoTool(tool) {
  const operations = {
    tool: 'MCP_OPERATION_TOOL',
    'resources.list': 'MCP_OPERATION_RESOURCES_LIST',
    'resources.read': 'MCP_OPERATION_RESOURCES_READ',
    'prompts.list': 'MCP_OPERATION_PROMPTS_LIST',
    'prompts.get': 'MCP_OPERATION_PROMPTS_GET',
  };
  return {
    source: `TOOL_SOURCE_${String(tool.source).toUpperCase()}`,
    owner: tool.owner || '',
    name: tool.name,
    label: tool.label || '',
    description: tool.description || '',
    parameters_json: tool.parameters === undefined ? '' : JSON.stringify(tool.parameters),
    output_schema_json: tool.outputSchema === undefined ? '' : JSON.stringify(tool.outputSchema),
    replay_safe: Boolean(tool.replaySafe),
    side_effecting: Boolean(tool.sideEffecting),
    direct_only: Boolean(tool.directOnly),
    operation: tool.source === 'mcp' ? operations[tool.operation || 'tool'] : 'MCP_OPERATION_UNSPECIFIED',
  };
}

// The JavaScript tool handlers. They serve the same deterministic data as
// examples/handlers.py for the shipping tools (rows from catalog.json
// fixtures), and answer every other tool with a `failed` ToolError.
function makeHandlers(fixtures) {
  const shipments = fixtures.shipments;
  const reply = (text, details) => ({ content: [{ type: 'text', text }], details });
  return {
    'host:shipping:shipping_list': async () => {
      const unpaid = shipments.filter((r) => !r.paid).length;
      return reply(`${shipments.length} shipments, ${unpaid} unpaid`, shipments);
    },
    'host:shipping:shipping_track': async (input) => {
      const s = shipments.find((r) => r.id === input.shipmentId);
      if (!s) throw Object.assign(new Error(`unknown shipment '${input.shipmentId}'`), { kind: 'invalid_input' });
      const events = [
        { at: '2024-07-01T06:00:00Z', location: 'Rotterdam', note: 'Booked' },
        { at: '2024-07-03T18:20:00Z', location: 'Rotterdam', note: 'Loaded on vessel' },
      ];
      if (!s.paid) events.push({ at: '2024-07-04T09:00:00Z', location: 'Rotterdam', note: 'Held: payment outstanding' });
      const status = s.paid ? 'in_transit' : 'held';
      return reply(`${s.id}: ${status}`, { shipmentId: s.id, status, events });
    },
  };
}

const KINDS = {
  invalid_input: 'TOOL_ERROR_KIND_INVALID_INPUT',
  blocked: 'TOOL_ERROR_KIND_BLOCKED',
  failed: 'TOOL_ERROR_KIND_FAILED',
  cancelled: 'TOOL_ERROR_KIND_CANCELLED',
};

function unary(client, method, request, deadlineMs) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: Date.now() + deadlineMs }, (err, response) =>
      err ? reject(err) : resolve(response),
    );
  });
}

function runExec(codeMode, start, handlers, timeoutMs) {
  return new Promise((resolve, reject) => {
    const call = codeMode.Exec({ deadline: Date.now() + timeoutMs });
    const toolCalls = [];
    const abandoned = new Set();
    let result = null;
    let settled = false;
    const finish = (fn, value) => {
      if (!settled) {
        settled = true;
        fn(value);
      }
    };

    call.on('data', (msg) => {
      switch (msg.message) {
        case 'tool_call': {
          const tc = msg.tool_call;
          toolCalls.push(tc.catalog_id);
          const handler = handlers[tc.catalog_id] || handlers[tc.name];
          let input = {};
          Promise.resolve()
            .then(() => {
              input = tc.input_json ? JSON.parse(tc.input_json) : {};
              if (!handler) {
                throw Object.assign(new Error(`no handler registered for ${tc.catalog_id}`), { kind: 'failed' });
              }
              return handler(input, tc);
            })
            .then(
              (value) => ({ nested_call_id: tc.nested_call_id, ok_json: JSON.stringify(value === undefined ? null : value) }),
              (err) => ({
                nested_call_id: tc.nested_call_id,
                error: { kind: KINDS[err.kind] || KINDS.failed, message: String((err && err.message) || err) || 'failed' },
              }),
            )
            .then((toolResult) => {
              if (result === null && !abandoned.has(tc.nested_call_id)) call.write({ tool_result: toolResult });
            });
          break;
        }
        case 'tool_call_cancelled':
          abandoned.add(msg.tool_call_cancelled.nested_call_id);
          break;
        case 'output':
          process.stderr.write(`exec_client: output ${msg.output.entry_json}\n`);
          break;
        case 'result':
          result = msg.result;
          call.end();
          break;
        default:
          process.stderr.write(`exec_client: ignoring unknown message ${JSON.stringify(msg)}\n`);
      }
    });
    call.on('error', (err) => finish(reject, err));
    call.on('end', () => {
      if (result === null) finish(reject, new Error('the Exec stream ended without a Result'));
    });
    call.on('status', (status) => {
      if (result !== null) finish(resolve, { result, toolCalls });
      else if (status.code !== grpc.status.OK) finish(reject, Object.assign(new Error(status.details), status));
    });
    call.write({ start });
  });
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const catalogDoc = JSON.parse(fs.readFileSync(opts.catalog, 'utf8'));
  const owners = opts.owners === 'all' ? null : new Set(opts.owners.split(',').map((s) => s.trim()));
  const tools = catalogDoc.tools.filter((t) => owners === null || owners.has(t.owner));
  const code = fs.readFileSync(opts.program, 'utf8');

  const { CatalogService, CodeModeService } = loadServices(opts.protoRoot);
  const credentials = grpc.credentials.createInsecure();
  const catalogs = new CatalogService(opts.target, credentials);
  const codeMode = new CodeModeService(opts.target, credentials);
  const scope = { session_id: opts.session, agent_run_id: opts.agentRun };

  try {
    const put = await unary(
      catalogs,
      'PutCatalog',
      { scope, tools: tools.map(toProtoTool), mode: 'REGISTRATION_MODE_REPLACE' },
      opts.timeoutMs,
    );
    process.stderr.write(`exec_client: registered ${put.catalog.entries.length} tools for ${scope.session_id}/${scope.agent_run_id}\n`);

    const start = {
      scope,
      tool_call_id: opts.toolCallId,
      arguments_json: JSON.stringify({ code }),
      turn_id: '',
      force_restart_safe: false,
    };
    const { result, toolCalls } = await runExec(codeMode, start, makeHandlers(catalogDoc.fixtures || {}), opts.timeoutMs);
    // One line: re-serialise so a pretty-printed result_json can never span lines.
    const resultObject = JSON.parse(result.result_json);
    const line = opts.metadata
      ? JSON.stringify({
          result: resultObject,
          status: result.status,
          code: result.code,
          runId: result.run_id,
          traceId: result.trace_id,
          metadata: result.metadata,
          toolCalls,
        })
      : JSON.stringify(resultObject);
    process.stdout.write(`${line}\n`);
    return 0;
  } catch (err) {
    const code = err && err.code !== undefined ? ` (grpc status ${err.code})` : '';
    process.stderr.write(`exec_client: ${(err && err.details) || (err && err.message) || err}${code}\n`);
    return 1;
  } finally {
    catalogs.close();
    codeMode.close();
  }
}

main().then(
  (status) => {
    process.exitCode = status;
  },
  (err) => {
    process.stderr.write(`exec_client: ${err && err.stack ? err.stack : err}\n`);
    process.exitCode = 1;
  },
);
