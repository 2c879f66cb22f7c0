// The cell's guest runtime (SPEC §8). Evaluated once per fresh VM, before any
// user code. It installs the guest API as frozen, non-writable globals and
// returns the controller object, whose handle only the guest agent (Python)
// keeps. User code can never reach the controller, settle its own bridge
// requests, read the output state or forge a host reply (SPEC §8.1 item 3).
//
// The controller never calls into Python while guest code runs: bridge
// requests, accepted output and omission counts go to an outbox that the agent
// takes in one call after each VM step (`take`). A host call costs about
// 100 µs plus ~70 µs per string argument, so a flood of thousands of requests
// or entries would otherwise keep the cell computing past its deadline.
(function (configText) {
  "use strict";
  const g = globalThis;

  // Keep private references to every built-in the controller uses, so a guest
  // that overwrites or deletes globals cannot change the controller's
  // behaviour.
  const O = Object;
  const freeze = O.freeze;
  const defineProperty = O.defineProperty;
  const hasOwn = O.prototype.hasOwnProperty;
  const objToString = O.prototype.toString;
  const ObjectProto = O.prototype;
  const getPrototypeOf = O.getPrototypeOf;
  const objectKeys = O.keys;
  const objectCreate = O.create;
  const jsonStringify = JSON.stringify;
  const jsonParse = JSON.parse;
  const MapCtor = Map;
  const mapGet = Map.prototype.get;
  const mapSet = Map.prototype.set;
  const mapHas = Map.prototype.has;
  const mapDelete = Map.prototype.delete;
  const WeakMapCtor = WeakMap;
  const weakGet = WeakMap.prototype.get;
  const weakSet = WeakMap.prototype.set;
  const PromiseCtor = Promise;
  const promiseThen = Promise.prototype.then;
  const ErrorCtor = Error;
  const InternalErrorCtor = typeof InternalError === "function" ? InternalError : ErrorCtor;
  const create = O.create;
  // Plain records the controller serialises or hands to the agent have no
  // prototype, so a guest-defined Object.prototype.toJSON or getter never runs.
  function record(fields) {
    const r = create(null);
    const keys = objectKeys(fields);
    for (let i = 0; i < keys.length; i++) r[keys[i]] = fields[keys[i]];
    return r;
  }
  const TypeErrorCtor = TypeError;
  const StringCtor = String;
  const NumberCtor = Number;
  const isFiniteFn = Number.isFinite;
  const mathFloor = Math.floor;
  const arrayIsArray = Array.isArray;
  const arrayJoin = Array.prototype.join;
  const strSplit = String.prototype.split;
  const strSlice = String.prototype.slice;
  const strIndexOf = String.prototype.indexOf;
  const strReplace = String.prototype.replace;
  const strStartsWith = String.prototype.startsWith;
  const regexExec = RegExp.prototype.exec;
  const reflectApply = Reflect.apply;
  const call = (fn, self, ...args) => reflectApply(fn, self, args);
  // The leg's configuration arrives as one string (one engine string instead of
  // a conversion per property): its compact JSON head, a line feed (never inside
  // compact JSON), then the catalog's JSON text as the host sent it. No guest
  // code has run yet, so the built-ins read here are the engine's own.
  const configCut = call(strIndexOf, configText, "\n");
  const config = jsonParse(call(strSlice, configText, 0, configCut));
  config.catalog = jsonParse(call(strSlice, configText, configCut + 1));
  const hasInstance = Function.prototype[Symbol.hasInstance];

  // Once user code has run, every built-in it can reach may be redefined,
  // poisoned or frozen (SPEC §8.1 item 5). The controller then only calls the
  // functions captured above and never relies on a lookup through a
  // prototype the guest can change: `instanceof` (Symbol.hasInstance),
  // `promise.then` (the constructor's Symbol.species), `Promise.resolve`,
  // `array.push` (index setters on Array.prototype) and re-serialising parsed
  // JSON (Object.prototype.toJSON) all have safe forms below.

  // `v instanceof C` by the engine's own algorithm; a Proxy whose trap throws
  // is no instance.
  function isInstance(v, C) {
    try {
      return call(hasInstance, C, v) === true;
    } catch (e) {
      return false;
    }
  }

  // Appends as an own data property: a guest setter on Array.prototype never runs.
  function append(arr, v) {
    defineProperty(arr, arr.length, { value: v, writable: true, enumerable: true, configurable: true });
  }

  // `p.then(f, r)` on a promise the controller made (or the program's own
  // async result) without the guest's species: an own `constructor` of
  // undefined makes the engine use the intrinsic Promise.
  function thenSafe(p, f, r) {
    defineProperty(p, "constructor", { value: undefined, writable: true, configurable: true });
    return call(promiseThen, p, f, r);
  }

  function resolved(v) {
    return new PromiseCtor((res) => res(v));
  }

  function rejected(e) {
    return new PromiseCtor((res, rej) => rej(e));
  }

  // ---- Outbox (taken by the agent after each VM step) ---------------------
  // Each part is the compact JSON text of one item: ["r", bridgeId, method,
  // argsJson] a request; ["o", entryJson] an accepted output entry;
  // ["x", method, refusal, firstN, count] `count` consecutive bridge ids of
  // `method` refused in the cell (one item for a whole flood of pending-cap
  // refusals). Parts are own data properties written with defineProperty and
  // built from strings only, so no guest setter, getter or toJSON ever sees
  // or changes them.
  let outboxParts = [];
  let lastRefusal = null; // { method, refusal, n, count, index } of the last part
  function outboxPut(index, text) {
    defineProperty(outboxParts, index, { value: text, writable: true, enumerable: true, configurable: true });
  }
  function hostSend(id, method, argsJson, refusal, n) {
    const q = jsonStringify;
    if (refusal === "") {
      lastRefusal = null;
      outboxPut(outboxParts.length, "[\"r\"," + q(id) + "," + q(method) + "," + q(argsJson) + "]");
      return;
    }
    const last = lastRefusal;
    if (last !== null && last.index === outboxParts.length - 1 && last.method === method && last.refusal === refusal && last.n + last.count === n) {
      last.count += 1;
    } else {
      lastRefusal = record({ method, refusal, n, count: 1, index: outboxParts.length });
    }
    const r = lastRefusal;
    outboxPut(r.index, "[\"x\"," + q(method) + "," + q(refusal) + "," + r.n + "," + r.count + "]");
  }
  function hostOutput(entryJson) {
    lastRefusal = null;
    outboxPut(outboxParts.length, "[\"o\"," + jsonStringify(entryJson) + "]");
  }

  const limits = config.limits;
  const USER_FILE = "cellblock:user.js";
  // User code is compiled by indirect eval, whose frames the engine labels
  // `<input>`; the controller's own frames carry another label.
  const ENGINE_USER_FILE = "<input>";
  const WRAPPER_PREFIX = config.wrapperPrefix;
  const WRAPPER_SUFFIX = config.wrapperSuffix;
  const WRAPPER_COLUMN_SHIFT = WRAPPER_PREFIX.length;
  const indirectEval = eval;

  // ---- UTF-8 sizes -------------------------------------------------------
  const encodeURIComponentFn = encodeURIComponent;
  const unescapeFn = unescape;
  // UTF-8 length in bytes. The native encoder is fast; strings with lone
  // surrogates (which it refuses) are counted by hand, 3 bytes each.
  function utf8Length(s) {
    try {
      return unescapeFn(encodeURIComponentFn(s)).length;
    } catch (e) {
      return utf8LengthSlow(s);
    }
  }

  function utf8LengthSlow(s) {
    let n = 0;
    for (let i = 0; i < s.length; i++) {
      const c = s.charCodeAt(i);
      if (c < 0x80) n += 1;
      else if (c < 0x800) n += 2;
      else if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length) {
        const d = s.charCodeAt(i + 1);
        if (d >= 0xdc00 && d <= 0xdfff) { n += 4; i++; } else n += 3;
      } else n += 3;
    }
    return n;
  }

  // Longest prefix of s whose UTF-8 length is at most maxBytes, never splitting
  // a surrogate pair.
  function utf8Prefix(s, maxBytes) {
    let n = 0;
    let i = 0;
    while (i < s.length) {
      const c = s.charCodeAt(i);
      let w = 3;
      let step = 1;
      if (c < 0x80) w = 1;
      else if (c < 0x800) w = 2;
      else if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length) {
        const d = s.charCodeAt(i + 1);
        if (d >= 0xdc00 && d <= 0xdfff) { w = 4; step = 2; }
      }
      if (n + w > maxBytes) break;
      n += w;
      i += step;
    }
    return call(strSlice, s, 0, i);
  }

  // ---- JSON safety (SPEC §8.8 rule 4) -------------------------------------
  function describeError(v) {
    let name = "Error";
    let message = "";
    try { name = StringCtor(v.name); } catch (e) { /* keep default */ }
    try { message = StringCtor(v.message); } catch (e) { /* keep default */ }
    return record({ name, message });
  }

  // Returns [ok, value]: ok false when nothing JSON-safe can be made.
  // Engine failures (out of memory, internal limits) are never papered over
  // with a String() fallback: they propagate, so a starved VM ends the run.
  function rethrowEngineError(e) {
    if (isInstance(e, InternalErrorCtor)) throw e;
  }

  // ---- Nesting bound (SPEC §8.8 rule 7) ------------------------------------
  // The engine's JSON.stringify (and Array.prototype.join, which String() of an
  // array runs) recurse in C with no stack check: about 12,000 levels (join:
  // about 750) trap the engine and end the leg [R10]. Every value the
  // controller serialises is therefore written by a stringify whose replacer
  // tracks its own depth and stops at MAX_VALUE_DEPTH levels of arrays and
  // objects (the host's limits.MAX_VALUE_DEPTH; a test compares them), before
  // the C recursion gets deep. The replacer sees each value after its toJSON ran and before its
  // members are written, so toJSON, getters and Proxies are counted as
  // serialised, once. `holders` is the path of objects being written
  // (prototype-less, so no guest index setter on Array.prototype runs); the
  // replacer is called with the holder of each member, which is on the path.
  const MAX_VALUE_DEPTH = 256;
  const DEPTH_TEXT = "nested deeper than " + MAX_VALUE_DEPTH + " levels";
  const TOO_DEEP = freeze(create(null)); // jsonSafe's answer for a value nested deeper
  function DepthExceeded() {}
  const TOO_LARGE = freeze(create(null)); // jsonSafe's answer for a text over its byte bound
  function SizeExceeded() {}
  // Whether arrays nest in `value` (an array) deeper than `max` levels, walked
  // iteratively. An array is walked again only when reached at a greater depth
  // (so a cycle ends at `max`, and each array is walked at most `max` times).
  function arraysNestDeeper(value, max) {
    const seen = new WeakMapCtor(); // array -> deepest level it was walked at
    const stack = [value, 1];
    let n = 2;
    while (n > 0) {
      const depth = stack[--n];
      const arr = stack[--n];
      if (depth > max) return true;
      for (let i = 0; i < arr.length; i++) {
        const x = arr[i];
        if (arrayIsArray(x) && !((call(weakGet, seen, x) || 0) >= depth + 1)) {
          call(weakSet, seen, x, depth + 1);
          defineProperty(stack, n++, { value: x, writable: true, enumerable: true, configurable: true });
          defineProperty(stack, n++, { value: depth + 1, writable: true, enumerable: true, configurable: true });
        }
      }
    }
    return false;
  }

  // `maxBytes` (optional): a text over that many UTF-8 bytes is TOO_LARGE.
  // The replacer adds up the string values it meets (each at least its length
  // plus two quotes in the text, a lower bound of the UTF-8 size) and stops
  // the stringify as soon as that sum is over the bound, so a value the host
  // would refuse is never written out, copied or sent (SPEC §9 rule 6).
  function boundedStringify(value, maxBytes) {
    const holders = create(null);
    let top = -1;
    let root = null;
    let chars = 0;
    function replacer(key, x) {
      if (root === null) root = this;
      if (typeof x === "string") {
        chars += x.length + 2;
        if (chars > maxBytes) throw new SizeExceeded();
        return x;
      }
      if (typeof x !== "object" || x === null) return x;
      while (top >= 0 && holders[top] !== this) top--;
      // A holder off the path (never, by the algorithm) counts as too deep: fail closed.
      if (top < 0 && this !== root) throw new DepthExceeded();
      if (top + 2 > MAX_VALUE_DEPTH) throw new DepthExceeded();
      top += 1;
      holders[top] = x;
      return x;
    }
    return jsonStringify(value, replacer);
  }

  // Whether text is over maxBytes UTF-8 bytes: its length (UTF-16 units) is a
  // lower bound of its UTF-8 size and three times it an upper bound, so the
  // exact count runs only in between.
  function overBytes(text, maxBytes) {
    if (text.length > maxBytes) return true;
    return text.length * 3 > maxBytes && utf8Length(text) > maxBytes;
  }

  // The compact JSON text of the JSON-safe value, TOO_DEEP when it (or its
  // toJSON result) nests deeper than MAX_VALUE_DEPTH, TOO_LARGE when its text
  // is over `maxBytes` UTF-8 bytes (optional; stopped as soon as that is
  // known), or undefined when nothing JSON-safe can be made. The text is kept
  // (never parsed and serialised again), so only the value's own toJSON and
  // getters run, once (twice when the first attempt threw and an object's
  // String() fallback is checked).
  function jsonSafe(value, maxBytes) {
    const bound = maxBytes === undefined ? 1 / 0 : maxBytes;
    const text = jsonSafeText(value, bound);
    if (typeof text === "string" && bound !== 1 / 0 && overBytes(text, bound)) return TOO_LARGE;
    return text;
  }

  function jsonSafeText(value, maxBytes) {
    if (value === undefined) return "null";
    let text;
    try {
      text = boundedStringify(value, maxBytes);
    } catch (e) {
      if (isInstance(e, DepthExceeded)) return TOO_DEEP;
      if (isInstance(e, SizeExceeded)) return TOO_LARGE;
      rethrowEngineError(e);
      text = undefined;
    }
    if (typeof text === "string") return text;
    if (isInstance(value, ErrorCtor)) return jsonStringify(describeError(value));
    const t = typeof value;
    if (t === "string" || t === "boolean" || value === null) return jsonStringify(value);
    if (t === "number" && isFiniteFn(value)) return jsonStringify(value);
    // String() of an array joins its members, recursing in C for each nested
    // array (a trap at about 750 levels): measured first, iteratively.
    // (Array.isArray and the walk throw for a revoked Proxy: String() decides then.)
    try {
      if (arrayIsArray(value) && arraysNestDeeper(value, MAX_VALUE_DEPTH)) return TOO_DEEP;
    } catch (e) {
      rethrowEngineError(e);
    }
    try { return jsonStringify(StringCtor(value)); } catch (e) { rethrowEngineError(e); return undefined; }
  }

  // A string as is, else jsonSafe's answer (text, TOO_DEEP or undefined).
  function renderText(value) {
    if (typeof value === "string") return value;
    return jsonSafe(value);
  }

  // The TypeError [B27] of text/json/yield_control for a value nested deeper than the bound.
  function tooDeep(fnName) {
    return new TypeErrorCtor(fnName + " could not turn its argument into JSON: it is nested deeper than " + MAX_VALUE_DEPTH + " levels; send flatter data.");
  }

  // The largest bridge message the host reads for this run (SPEC §2.3): the
  // larger of the output budget and the reply inbox, plus one bridge chunk.
  function bridgeMessageBytes() {
    return (B > limits.replyInboxBytes ? B : limits.replyInboxBytes) + BRIDGE_CHUNK_BYTES;
  }
  const BRIDGE_CHUNK_BYTES = 1048576;

  // ---- Output budget, first layer (SPEC §9 rules 3-5, 11) -----------------
  const B = limits.maxOutputBytes;
  const R = mathFloor(B / 4);
  const C = B - R;
  const K = 256;
  const out = {
    spent: limits.outputSpentBytes,
    closed: limits.outputClosed,
    omittedEntries: 0,
    omittedBytes: 0,
    firstOmitted: null,
    // What `take` already reported to the agent in this leg.
    reportedEntries: 0,
    reportedBytes: 0,
    firstReported: false,
  };

  // entry: the entry's JSON text; content: its text, or its value's JSON text.
  function emit(text, content) {
    const size = utf8Length(text);
    if (!out.closed && out.spent + size + K <= C) {
      out.spent += size;
      hostOutput(text);
      return;
    }
    out.closed = true;
    out.omittedEntries += 1;
    out.omittedBytes += size;
    if (out.firstOmitted === null) out.firstOmitted = utf8Prefix(content, C);
  }

  function emitText(t) {
    emit("{\"type\":\"text\",\"text\":" + jsonStringify(t) + "}", t);
  }

  function textFn(value) {
    const t = renderText(value);
    if (t === TOO_DEEP) throw tooDeep("text");
    if (t === undefined) throw new TypeErrorCtor("text could not turn its argument into JSON or text.");
    emitText(t);
  }

  function jsonFn(value) {
    const safe = jsonSafe(value);
    if (safe === TOO_DEEP) throw tooDeep("json");
    if (safe === undefined) throw new TypeErrorCtor("json could not turn its argument into JSON or text.");
    emit("{\"type\":\"json\",\"value\":" + safe + "}", safe);
  }

  function consoleLine(...args) {
    const parts = [];
    for (let i = 0; i < args.length; i++) {
      const t = renderText(args[i]);
      append(parts, t === TOO_DEEP ? "[" + DEPTH_TEXT + "]" : t === undefined ? "[unrenderable]" : t);
    }
    emitText(call(arrayJoin, parts, " "));
  }

  // ---- Bridge requests (SPEC §8.2) ----------------------------------------
  const pending = new MapCtor(); // bridge id -> { resolve, reject, method, timer? }
  const provenance = new WeakMapCtor(); // rejection error -> bridge id
  // method -> last n; prototype-less, so no guest accessor on Object.prototype
  // can read or swallow a count (SPEC §8.2 item 2).
  const counters = record(config.bridgeCounters);
  let hostWork = 0;

  // A request the controller refuses itself (SPEC §8.2 items 3-4) takes the
  // method's next id like a sent one, is recorded with the host (no answer
  // comes) and returns the Error, whose provenance is that id's (§8.2 item 6).
  function refuseRequest(method, refusal, message) {
    const n = (counters[method] || 0) + 1;
    counters[method] = n;
    const id = "bridge:" + method + ":" + n;
    const err = new ErrorCtor(message);
    call(weakSet, provenance, err, id);
    hostSend(id, method, "", refusal, n);
    return err;
  }

  function helperName(method) {
    if (method === "callValue" || method === "call" || method === "search" || method === "describe") return "tools." + method;
    if (method === "namespace") return "MCP";
    return method;
  }

  // Makes one bridge request and returns its promise. A request refused in
  // the cell rejects that promise, or with `throwRefusal` (setTimeout: no
  // promise reaches the program) is thrown to the caller instead.
  function request(method, args, throwRefusal) {
    let resolveFn;
    let rejectFn;
    const promise = new PromiseCtor((res, rej) => { resolveFn = res; rejectFn = rej; });
    const refused = (err) => {
      if (throwRefusal) throw err;
      rejectFn(err);
      return promise;
    };
    if (hostWork >= limits.maxPendingToolCalls) {
      return refused(refuseRequest(method, "pending_cap", "too many pending host calls (limit " + limits.maxPendingToolCalls + "); await some before starting more."));
    }
    // Each argument crosses as its own JSON-safe value (SPEC §8.8 rule 4).
    const safeArgs = [];
    for (let i = 0; i < args.length; i++) {
      // An argument over the inbox alone is refused [B22] as soon as that is known.
      const safe = jsonSafe(args[i], limits.replyInboxBytes);
      if (safe === TOO_LARGE) {
        return refused(refuseRequest(method, "too_large", "this " + method + " request is over " + limits.replyInboxBytes + " bytes, more than the bridge accepts (" + limits.replyInboxBytes + " bytes); send less data."));
      }
      if (safe === TOO_DEEP) {
        // [B23], recorded by the host with input provenance like its own.
        return refused(refuseRequest(method, "too_deep", "this " + method + " request is nested too deeply for the bridge (at most " + MAX_VALUE_DEPTH + " levels of arrays and objects); send flatter data."));
      }
      if (safe === undefined) {
        return refused(new TypeErrorCtor(helperName(method) + " could not turn its argument into JSON or text."));
      }
      append(safeArgs, safe);
    }
    const text = "[" + call(arrayJoin, safeArgs, ",") + "]";
    const size = utf8Length(text);
    if (size > limits.replyInboxBytes) {
      return refused(refuseRequest(method, "too_large", "this " + method + " request is " + size + " bytes, more than the bridge accepts (" + limits.replyInboxBytes + " bytes); send less data."));
    }
    const n = (counters[method] || 0) + 1;
    counters[method] = n;
    const id = "bridge:" + method + ":" + n;
    hostWork += 1;
    call(mapSet, pending, id, { resolve: resolveFn, reject: rejectFn, method });
    hostSend(id, method, text, "");
    return promise;
  }

  // ---- Timers (SPEC §8.9) --------------------------------------------------
  let nextTimerId = config.nextTimerId;
  const timers = new MapCtor(); // timer id -> { bridgeId, fn, args, cleared }
  let timerError = null;

  function setTimeoutFn(fn, delay, ...args) {
    if (typeof fn !== "function") throw new TypeErrorCtor("setTimeout needs a function as its first argument.");
    let d = NumberCtor(delay);
    if (!isFiniteFn(d) || d < 0 || d !== d) d = 0;
    d = mathFloor(d);
    // A timer the cell refuses (the pending cap, SPEC §8.9 item 3) throws its
    // [B13] here: it would never fire, and nothing else could tell the program.
    const timerId = nextTimerId++;
    const settled = request("timer", [d], true);
    const entry = { fn, args, cleared: false };
    call(mapSet, timers, timerId, entry);
    thenSafe(settled, () => {
      call(mapDelete, timers, timerId);
      if (entry.cleared) return;
      try {
        reflectApply(fn, undefined, args);
      } catch (e) {
        if (timerError === null) timerError = { error: e };
      }
    }, () => { call(mapDelete, timers, timerId); });
    return timerId;
  }

  function clearTimeoutFn(id) {
    if (typeof id !== "number") return;
    const entry = call(mapGet, timers, id);
    if (entry) entry.cleared = true;
  }

  // ---- Catalog helpers (SPEC §8.3) ----------------------------------------
  function deepFreeze(v) {
    if (v !== null && typeof v === "object") {
      const keys = O.getOwnPropertyNames(v);
      for (let i = 0; i < keys.length; i++) deepFreeze(v[keys[i]]);
      freeze(v);
    }
    return v;
  }

  const catalog = config.catalog;
  const allTools = deepFreeze(catalog.allTools);

  const tools = O.create(null);
  defineProperty(tools, "search", { value: function search(query, options) { return request("search", [query, options === undefined ? null : options]); }, enumerable: true });
  defineProperty(tools, "describe", { value: function describe(id) { return request("describe", [id]); }, enumerable: true });
  defineProperty(tools, "call", { value: function callTool(id, input) { return request("call", [id, input === undefined ? {} : input]); }, enumerable: true });
  defineProperty(tools, "callValue", { value: function callValue(id, input) { return request("callValue", [id, input === undefined ? {} : input]); }, enumerable: true });
  const convenience = catalog.convenience;
  const convNames = O.keys(convenience);
  for (let i = 0; i < convNames.length; i++) {
    const name = convNames[i];
    const id = convenience[name];
    defineProperty(tools, name, { value: function (input) { return request("callValue", [id, input === undefined ? {} : input]); }, enumerable: true });
  }
  freeze(tools);

  // ---- API files (SPEC §8.6) -----------------------------------------------
  // Declaration texts arrive as templates: indexes into `mcp.texts`, the distinct
  // pieces of the rendered files (a tool's block once for its server file and every
  // $api() header that selects it), joined when the program reads them.
  const mcpData = catalog.mcp ? catalog.mcp : null;
  const texts = mcpData !== null ? freeze(mcpData.texts) : [];
  function joinTexts(template) {
    const parts = [];
    for (let i = 0; i < template.length; i++) append(parts, texts[template[i]]);
    return call(arrayJoin, parts, "");
  }
  const apiFiles = deepFreeze(catalog.apiFiles || []);
  function normalisePath(p) {
    let s = StringCtor(p);
    while (call(strStartsWith, s, "/")) s = call(strSlice, s, 1);
    return s;
  }
  const API = freeze({
    list: function list(prefix) {
      let files = [];
      let pre = prefix === undefined || prefix === null ? "" : normalisePath(prefix);
      while (pre.length && pre[pre.length - 1] === "/") pre = call(strSlice, pre, 0, -1);
      for (let i = 0; i < apiFiles.length; i++) {
        const f = apiFiles[i];
        if (!f.bytes) continue;
        if (pre === "" || f.path === pre || call(strStartsWith, f.path, pre + "/")) {
          append(files, { path: f.path, description: f.description, bytes: f.bytes });
        }
      }
      return resolved({ files });
    },
    read: function read(path) {
      const p = normalisePath(path);
      const segs = call(strSplit, p, "/");
      for (let i = 0; i < segs.length; i++) {
        if (segs[i] === "" || segs[i] === "." || segs[i] === "..") {
          return rejected(new ErrorCtor("API file path is invalid: \"" + call(strSlice, StringCtor(path), 0, 200) + "\"."));
        }
      }
      for (let i = 0; i < apiFiles.length; i++) {
        const f = apiFiles[i];
        if (f.path === p && f.bytes) {
          return resolved(freeze({ path: f.path, content: joinTexts(f.content), description: f.description, bytes: f.bytes }));
        }
      }
      return rejected(new ErrorCtor("Unknown API file: \"" + call(strSlice, p, 0, 200) + "\". Call API.list() to see the available files."));
    },
  });

  // ---- MCP namespace (SPEC §8.5, §8.7) --------------------------------------
  // Built from host data: servers in identifier order, each with its tools
  // (bridge paths, required names, schema defaults) and its $api headers.
  // Schemas and defaults arrive as JSON text: each read parses a fresh copy
  // (never a guest toJSON: nothing is serialised after user code runs).
  if (mcpData !== null) {
    for (let s = 0; s < mcpData.servers.length; s++) {
      const server = mcpData.servers[s];
      deepFreeze(server.tools);
      deepFreeze(server.header);
      freeze(server);
    }
    deepFreeze(mcpData.root);
  }
  const cut200 = (v) => call(strSlice, StringCtor(v), 0, 200);

  function isPlainObject(v) {
    if (v === null || typeof v !== "object" || arrayIsArray(v)) return false;
    const proto = getPrototypeOf(v);
    return proto === ObjectProto || proto === null;
  }

  // B14/B15 are refused here, before any request; the host records the
  // rejection with input provenance (SPEC §8.5 item 6, §8.2 item 6).
  function refuseNamespace(message) {
    return rejected(refuseRequest("namespace", "namespace_arguments", message));
  }

  function namespaceFunction(tool) {
    const path = tool.path;
    return function (...args) {
      if (args.length > 1 || (args.length === 1 && args[0] !== undefined && !isPlainObject(args[0]))) {
        return refuseNamespace(cut200(path) + " takes a single object argument.");
      }
      const given = args.length === 1 && args[0] !== undefined ? args[0] : {};
      const input = objectCreate(null);
      const keys = objectKeys(given);
      for (let i = 0; i < keys.length; i++) {
        defineProperty(input, keys[i], { value: given[keys[i]], enumerable: true, writable: true, configurable: true });
      }
      const defaults = tool.defaults;
      for (let i = 0; i < defaults.length; i++) {
        const name = defaults[i][0];
        if (!call(hasOwn, input, name)) {
          defineProperty(input, name, { value: jsonParse(defaults[i][1]), enumerable: true, writable: true, configurable: true });
        }
      }
      const missing = [];
      for (let i = 0; i < tool.required.length; i++) {
        if (!call(hasOwn, input, tool.required[i])) append(missing, tool.required[i]);
      }
      if (missing.length) {
        return refuseNamespace(cut200(path) + " is missing required argument(s): " + call(arrayJoin, missing, ", ") + ".");
      }
      return request("namespace", ["MCP", tool.bridgePath, input]);
    };
  }

  function toolSummary(t) {
    return { method: t.method, path: t.path, mcpTool: t.mcpTool, operation: t.operation, description: t.description };
  }

  function serverApi(server) {
    return function $api(selector, options) {
      let chosen;
      let header;
      if (selector === undefined || selector === null) {
        chosen = [];
        for (let i = 0; i < server.tools.length; i++) append(chosen, i);
        header = joinTexts(server.header);
      } else {
        const sel = typeof selector === "string" && call(hasOwn, server.selectors, selector) ? server.selectors[selector] : undefined;
        if (sel === undefined) {
          return rejected(new ErrorCtor("MCP." + server.identifier + " has no tool matching \"" + cut200(selector) + "\"; call MCP." + server.identifier + ".$api() to list its tools."));
        }
        chosen = sel[0];
        header = joinTexts(sel[1]);
      }
      const out = {
        kind: "mcp_api",
        scope: chosen.length === 1 ? "tool" : "server",
        server: { identifier: server.identifier, serverName: server.serverName },
        header,
        tools: [],
      };
      for (let i = 0; i < chosen.length; i++) append(out.tools, toolSummary(server.tools[chosen[i]]));
      let wantSchemas = false;
      try { wantSchemas = options !== null && typeof options === "object" && options.schema === true; } catch (e) { wantSchemas = false; }
      if (wantSchemas) {
        const schemas = {};
        for (let i = 0; i < chosen.length; i++) {
          const t = server.tools[chosen[i]];
          defineProperty(schemas, t.method, { value: jsonParse(t.parameters), enumerable: true, writable: true, configurable: true });
        }
        out.schemas = schemas;
      }
      out.note = server.note;
      return resolved(out);
    };
  }

  let MCP = null;
  if (mcpData !== null) {
    MCP = objectCreate(null);
    const root = mcpData.root;
    defineProperty(MCP, "$api", {
      value: function $api() {
        return resolved({ kind: "mcp_api", scope: "root", header: joinTexts(root.header), servers: jsonParse(root.servers), note: root.note });
      },
    });
    for (let s = 0; s < mcpData.servers.length; s++) {
      const server = mcpData.servers[s];
      const obj = objectCreate(null);
      const groups = objectCreate(null);
      defineProperty(obj, "$api", { value: serverApi(server) });
      for (let i = 0; i < server.tools.length; i++) {
        const tool = server.tools[i];
        const fn = namespaceFunction(tool);
        const segs = call(strSplit, tool.method, ".");
        if (segs.length === 1) {
          defineProperty(obj, tool.method, { value: fn, enumerable: true });
        } else {
          if (!call(hasOwn, groups, segs[0])) groups[segs[0]] = objectCreate(null);
          defineProperty(groups[segs[0]], segs[1], { value: fn, enumerable: true });
        }
      }
      const groupNames = objectKeys(groups);
      for (let i = 0; i < groupNames.length; i++) {
        defineProperty(obj, groupNames[i], { value: freeze(groups[groupNames[i]]), enumerable: true });
      }
      defineProperty(MCP, server.identifier, { value: freeze(obj), enumerable: true });
    }
    freeze(MCP);
  }

  // ---- yield_control (SPEC §8.9) -------------------------------------------
  function yieldControl(reason) {
    let r = null;
    if (reason !== undefined && reason !== null) r = typeof reason === "string" ? reason : renderText(reason);
    if (r === TOO_DEEP) return rejected(tooDeep("yield_control"));
    return request("yield", [r === undefined ? null : r]);
  }

  // The engine calls a guest-set Error.prepareStackTrace with call-site objects
  // whose getFunction() would hand out controller functions on the stack; fix
  // it to undefined before any user code runs.
  defineProperty(ErrorCtor, "prepareStackTrace", { value: undefined, writable: false, configurable: false, enumerable: false });

  // ---- Globals (SPEC §8.1) -------------------------------------------------
  const consoleObj = freeze({ log: consoleLine, info: consoleLine, warn: consoleLine, error: consoleLine });
  const globalsToInstall = {
    ALL_TOOLS: allTools,
    tools,
    API,
    namespaces: MCP !== null ? freeze({ MCP }) : freeze({}),
    text: textFn,
    json: jsonFn,
    console: consoleObj,
    yield_control: yieldControl,
    setTimeout: setTimeoutFn,
    clearTimeout: clearTimeoutFn,
  };
  if (MCP !== null) globalsToInstall.MCP = MCP;
  const names = O.keys(globalsToInstall);
  for (let i = 0; i < names.length; i++) {
    defineProperty(g, names[i], { value: globalsToInstall[names[i]], writable: false, configurable: false, enumerable: false });
  }

  // ---- Error text (SPEC §8.10) ----------------------------------------------
  // Only `at <function> (<file>:<line>:<column>)` lines are call frames. The
  // engine also writes parse positions without a function (`at <input>:1:1`)
  // for errors of JSON.parse, eval and Function: those point into the parsed
  // text, never into the user's source, so they are not user frames.
  const FRAME_RE = /^\s*at (.*?) \((.*):(\d+):(\d+)\)\s*$/;
  function userFrames(stack) {
    const frames = [];
    if (typeof stack !== "string") return frames;
    const lines = call(strSplit, stack, "\n");
    for (let i = 0; i < lines.length && frames.length < 10; i++) {
      const m = call(regexExec, FRAME_RE, lines[i]);
      if (!m) continue;
      if (m[2] !== ENGINE_USER_FILE) continue;
      let fn = m[1];
      if (fn === "<eval>") continue;
      const line = NumberCtor(m[3]);
      let col = NumberCtor(m[4]);
      // Line 1 carries the wrapper prefix; a position inside it (the engine
      // had no finer one) is reported as column 1. Columns are 1-based.
      if (line === 1) col -= WRAPPER_COLUMN_SHIFT;
      if (col < 1) col = 1;
      if (fn === "__cellblock_main" || fn === "") fn = "<anonymous>";
      append(frames, "    at " + fn + " (" + USER_FILE + ":" + line + ":" + col + ")");
    }
    return frames;
  }

  function errorText(e) {
    let isErrorLike = false;
    try { isErrorLike = isInstance(e, ErrorCtor) || (e !== null && typeof e === "object" && typeof e.name === "string" && typeof e.message === "string" && "stack" in e); } catch (x) { isErrorLike = false; }
    if (isErrorLike) {
      const d = describeError(e);
      let stack = "";
      try { stack = e.stack; } catch (x) { stack = ""; }
      const frames = userFrames(stack);
      const head = d.name + ": " + d.message;
      return frames.length ? head + "\n" + call(arrayJoin, frames, "\n") : head;
    }
    const t = renderText(e);
    return "Uncaught " + (t === TOO_DEEP ? "[value " + DEPTH_TEXT + "]" : t === undefined ? "[unrenderable value]" : t);
  }

  // "<line>:<message>" of a compile error; the engine's column for early errors
  // points at the wrapper, so only the line is kept (1-based, user's source).
  function compileErrorText(e) {
    const d = describeError(e);
    let line = 1;
    let stack = "";
    try { stack = StringCtor(e.stack); } catch (x) { stack = ""; }
    const m = call(regexExec, /:(\d+):-?\d+\)?\s*$/m, stack);
    if (m) line = NumberCtor(m[1]);
    return line + ":" + d.message;
  }

  // ---- The program ------------------------------------------------------------
  // Replies to the agent are arrays of primitives in a fixed field order (the
  // same lists as in _vm.py): the agent reads an array by index, while reading
  // an object's keys would build a key array through Array.prototype, where a
  // guest accessor could throw.
  const STATUS_FIELDS = ["phase", "hostWork", "failureKind", "failureMessage", "failureBridgeId", "valueJson", "reason"];
  // TAKE_FIELDS (_vm.py): items, omittedEntries, omittedBytes, firstOmitted (takeText).
  // A reply (an array of primitives and nulls, made by replyOf) as JSON text.
  function replyJson(reply) {
    let text = "[";
    for (let i = 0; i < reply.length; i++) text += (i ? "," : "") + (reply[i] === null ? "null" : jsonStringify(reply[i]));
    return text + "]";
  }
  function replyOf(fields, names) {
    const reply = [];
    for (let i = 0; i < names.length; i++) {
      const v = fields[names[i]];
      append(reply, v === undefined ? null : v);
    }
    return reply;
  }

  const state = { phase: "idle", value: undefined, error: undefined };

  // Hands the outbox to the agent and empties it, as the JSON text of a reply
  // in TAKE_FIELDS order: `items` is the JSON array of the outbox parts as it
  // is (built by the controller from strings only; see reportJson), the
  // omission fields are the entries omitted since the previous take (SPEC §9
  // rule 11), so every result can end with its marker however the leg ends.
  // `firstOmitted` is a string of the first omitted content's JSON string
  // literal (guest text may hold lone surrogates), or "".
  function takeText() {
    const items = "[" + call(arrayJoin, outboxParts, ",") + "]";
    outboxParts = [];
    lastRefusal = null;
    let first = "\"\"";
    if (out.firstOmitted !== null && !out.firstReported) {
      first = jsonStringify(jsonStringify(out.firstOmitted));
      out.firstReported = true;
    }
    const text = "[" + items + "," + (out.omittedEntries - out.reportedEntries) + "," + (out.omittedBytes - out.reportedBytes) + "," + first + "]";
    out.reportedEntries = out.omittedEntries;
    out.reportedBytes = out.omittedBytes;
    return text;
  }

  function onFulfilled(v) { state.phase = "fulfilled"; state.value = v; }
  function onRejected(e) { state.phase = "rejected"; state.error = e; }

  const controller = freeze({
    start(source) {
      state.phase = "pending";
      let p;
      let fn;
      try {
        fn = indirectEval(WRAPPER_PREFIX + source + WRAPPER_SUFFIX);
      } catch (e) {
        // The engine refused the source itself (an early error the host's
        // parser accepted): no guest code ran.
        state.phase = "compile_error";
        state.error = e;
        return;
      }
      try {
        p = fn();
      } catch (e) {
        onRejected(e);
        return;
      }
      thenSafe(p, onFulfilled, onRejected);
    },
    // Settles one bridge request: ok -> resolve with the parsed JSON value;
    // otherwise reject with a plain Error carrying only the message (and the
    // code when given).
    settle(id, ok, payload, code) {
      const entry = call(mapGet, pending, id);
      if (!entry) return false;
      call(mapDelete, pending, id);
      hostWork -= 1;
      if (ok) {
        entry.resolve(jsonParse(payload));
      } else {
        const err = new ErrorCtor(payload);
        if (code) defineProperty(err, "code", { value: code, writable: true, configurable: true, enumerable: true });
        call(weakSet, provenance, err, id);
        entry.reject(err);
      }
      return true;
    },
    // settle() with its arguments packed into one string, so the agent makes
    // one engine string per settlement: a JSON header [id, ok, code], a line
    // feed (never inside the compact header), then the payload text as is.
    settleText(text) {
      const cut = call(strIndexOf, text, "\n");
      const head = jsonParse(call(strSlice, text, 0, cut));
      return controller.settle(head[0], head[1] === true, call(strSlice, text, cut + 1), head[2]);
    },
    // take(), status() and take() again in one call and one JSON text
    // [take, status, take]: the outbox first, then what a value's toJSON wrote
    // while status() serialised it (so a leg's end needs no further call).
    // Made from their primitives one by one, so no array or object is
    // serialised and no guest toJSON can take part.
    // The take replies' items are the outbox's JSON array text as it is (built
    // by the controller from strings only), not a string literal of it: no
    // second escape here and no second parse in the agent. A pending leg's
    // status (the reply between two nested calls) is written directly.
    reportJson() {
      const taken = takeText();
      let status;
      if (timerError === null && state.phase === "pending") status = "[\"pending\"," + hostWork + ",null,null,null,null,null]";
      else status = replyJson(controller.status());
      return "[" + taken + "," + status + "," + takeText() + "]";
    },
    // take() as one JSON text (the outbox flushed before an end or a snapshot).
    takeJson() {
      return takeText();
    },
    // Returns the leg's state for the guest agent (STATUS_FIELDS).
    status() {
      const s = record({ phase: state.phase, hostWork });
      if (timerError !== null) {
        s.phase = "rejected";
        s.failureKind = "guest";
        s.failureMessage = jsonStringify(errorText(timerError.error));
        return replyOf(s, STATUS_FIELDS);
      }
      if (state.phase === "fulfilled" && hostWork === 0) {
        // Serialised once, when the leg can end: the value's toJSON and
        // getters do not run again on every idle turn.
        // Over the bridge message bound (SPEC §2.3) the host would refuse the
        // end unread: refused here, before it is copied or sent (§9 rule 6).
        const bound = bridgeMessageBytes();
        const safe = jsonSafe(state.value, bound);
        if (safe === TOO_LARGE) {
          s.phase = "unserialisable";
          s.reason = "its compact JSON is over " + bound + " bytes, more than the host reads from the cell, so return less data";
        } else if (safe === TOO_DEEP) {
          s.phase = "unserialisable";
          s.reason = "nesting is deeper than " + MAX_VALUE_DEPTH + " levels";
        } else if (safe === undefined) {
          s.phase = "unserialisable";
          s.reason = "the value and its String() conversion both threw";
        } else {
          s.valueJson = safe;
        }
      } else if (state.phase === "rejected" || state.phase === "compile_error") {
        const e = state.error;
        let bridgeId = undefined;
        if (e !== null && (typeof e === "object" || typeof e === "function")) bridgeId = call(weakGet, provenance, e);
        s.failureKind = state.phase === "compile_error" ? "compile" : bridgeId !== undefined ? "bridge" : "guest";
        // A JSON string literal: guest text may hold lone surrogates.
        s.failureMessage = jsonStringify(state.phase === "compile_error" ? compileErrorText(e) : errorText(e));
        if (bridgeId !== undefined) s.failureBridgeId = bridgeId;
      }
      return replyOf(s, STATUS_FIELDS);
    },
    // Prepares the next leg after a restore: new limits and output state, from
    // the compact JSON text {"limits": ...} (one engine string).
    resume(limitsText) {
      const l = jsonParse(limitsText).limits;
      limits.maxPendingToolCalls = l.maxPendingToolCalls;
      limits.replyInboxBytes = l.replyInboxBytes;
      out.spent = l.outputSpentBytes;
      out.closed = l.outputClosed;
      out.omittedEntries = 0;
      out.omittedBytes = 0;
      out.firstOmitted = null;
      out.reportedEntries = 0;
      out.reportedBytes = 0;
      out.firstReported = false;
    },
  });
  return controller;
})
