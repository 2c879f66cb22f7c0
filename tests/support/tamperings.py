"""Tamperings of the guest's built-ins and hostile values, shared by the unit and integration tests (issue 11 item 5).

Each tampering is JavaScript statements a program runs before it uses the guest API; `program`
places it at top level, just before a park (`yield_control`) or right after the resume, followed
by an ending that exercises the controller: console/text/json output, a tool call (`tools.echo`),
a timer, `API.list()` and a final value or a thrown error.
"""

from __future__ import annotations

#: A function that throws, and accessors that throw; they keep their own Error (the tampering may replace it).
THROWER = '((E) => function () { throw new E("tampered"); })(Error)'
GETTER = '((E) => ({ get() { throw new E("tampered getter"); }, set() { throw new E("tampered setter"); }, configurable: true }))(Error)'
#: Names the controller's own records and bridge counters use, poisoned on Object.prototype.
CONTROLLER_KEYS = '["phase", "hostWork", "value", "valueJson", "error", "failureKind", "failureMessage", "items", "index", "count", "method", "n", "refusal", "resolve", "reject", "type", "text", "limits", "callValue", "call", "search", "describe", "yield", "timer", "namespace", "name", "message", "0", "1", "length"]'
PROXY_TRAPS = f"{{ get: {THROWER}, has: {THROWER}, ownKeys: {THROWER}, getOwnPropertyDescriptor: {THROWER}, getPrototypeOf: {THROWER} }}"

#: Tamperings: statements run by the program before it uses the guest API.
TAMPERINGS: dict[str, str] = {
    "Promise.prototype.constructor getter throws": f"Object.defineProperty(Promise.prototype, 'constructor', {GETTER});",
    "Promise replaced": f"globalThis.Promise = {THROWER};",
    "Promise deleted": "delete globalThis.Promise;",
    "Promise.prototype.then throws": f"Promise.prototype.then = {THROWER};",
    "Promise.prototype.then never calls back": "Promise.prototype.then = function () { return this; };",
    "Promise.prototype.catch/finally throw": f"Promise.prototype.catch = Promise.prototype.finally = {THROWER};",
    "Promise.resolve/reject/all throw": f"Promise.resolve = Promise.reject = Promise.all = {THROWER};",
    "Promise[Symbol.species] getter throws": f"Object.defineProperty(Promise, Symbol.species, {GETTER});",
    "Error[Symbol.hasInstance] throws": f"Object.defineProperty(Error, Symbol.hasInstance, {{ value: {THROWER} }});",
    "Object[Symbol.hasInstance] throws": f"Object.defineProperty(Object, Symbol.hasInstance, {{ value: {THROWER} }});",
    "InternalError/TypeError[Symbol.hasInstance] throw": f"for (const C of [TypeError, RangeError, globalThis.InternalError].filter(Boolean)) Object.defineProperty(C, Symbol.hasInstance, {{ value: {THROWER} }});",
    "Symbol.toPrimitive on Error and Object prototypes throws": f"Error.prototype[Symbol.toPrimitive] = Object.prototype[Symbol.toPrimitive] = {THROWER};",
    "Error.prototype message/name/stack getters throw": f"for (const k of ['message', 'name', 'stack']) Object.defineProperty(Error.prototype, k, {GETTER});",
    "Error.prototype.toString throws": f"Error.prototype.toString = Object.prototype.toString = {THROWER};",
    "Error.captureStackTrace/stackTraceLimit poisoned": f"Error.captureStackTrace = {THROWER}; Object.defineProperty(Error, 'stackTraceLimit', {GETTER});",
    "Error.prepareStackTrace set": "try { Error.prepareStackTrace = () => { throw new Error('tampered'); }; } catch (e) {}",
    "Error replaced": f"globalThis.Error = globalThis.TypeError = {THROWER};",
    "JSON.stringify/parse throw": f"JSON.stringify = JSON.parse = {THROWER};",
    "JSON deleted": "delete globalThis.JSON;",
    "Object.prototype.toJSON throws": f"Object.prototype.toJSON = {THROWER};",
    "Array.prototype.toJSON throws": f"Array.prototype.toJSON = {THROWER};",
    "Object.prototype.then getter throws": f"Object.defineProperty(Object.prototype, 'then', {GETTER});",
    "Array.prototype push/map/join/slice throw": f"for (const k of ['push', 'map', 'join', 'slice', 'concat', 'forEach', 'filter']) Array.prototype[k] = {THROWER};",
    "Array.prototype index accessors": f"for (const k of ['0', '1', '2']) Object.defineProperty(Array.prototype, k, {GETTER});",
    "Array[Symbol.species] getter throws": f"Object.defineProperty(Array, Symbol.species, {GETTER});",
    "Function.prototype call/apply/bind throw": f"Function.prototype.call = Function.prototype.apply = Function.prototype.bind = {THROWER};",
    "Reflect.* throw": f"for (const k of Object.getOwnPropertyNames(Reflect)) {{ try {{ Reflect[k] = {THROWER}; }} catch (e) {{}} }}",
    "Object.* throw": f"const names = Object.getOwnPropertyNames(Object); for (const k of names) {{ try {{ Object[k] = {THROWER}; }} catch (e) {{}} }}",
    "controller record keys poisoned on Object.prototype": f"for (const k of {CONTROLLER_KEYS}) Object.defineProperty(Object.prototype, k, {GETTER});",
    "String.prototype methods and Symbol.split/replace throw": f"for (const k of ['split', 'slice', 'replace', 'startsWith', 'charCodeAt', 'toString', 'valueOf', Symbol.split, Symbol.replace, Symbol.iterator]) String.prototype[k] = {THROWER};",
    "RegExp.prototype exec/Symbol.split throw": f"RegExp.prototype.exec = RegExp.prototype[Symbol.split] = RegExp.prototype[Symbol.match] = {THROWER};",
    "Map/WeakMap methods throw": f"for (const P of [Map.prototype, WeakMap.prototype]) for (const k of ['get', 'set', 'has', 'delete']) P[k] = {THROWER};",
    "String/Number/Symbol/Math replaced": f"globalThis.String = globalThis.Number = globalThis.Symbol = {THROWER}; globalThis.Math = null;",
    "encodeURIComponent/unescape/eval replaced": f"globalThis.encodeURIComponent = globalThis.unescape = globalThis.eval = {THROWER};",
    "globalThis frozen": "Object.freeze(globalThis);",
    "globalThis sealed": "Object.seal(globalThis);",
    "globalThis not extensible": "Object.preventExtensions(globalThis);",
    "intrinsics frozen": "for (const o of [Object.prototype, Array.prototype, Promise.prototype, Promise, Error, Error.prototype, Function.prototype, JSON, Map.prototype, String.prototype]) Object.freeze(o);",
    "globalThis prototype is a throwing Proxy": f"Object.setPrototypeOf(globalThis, new Proxy({{}}, {PROXY_TRAPS}));",
    "controller globals deleted or overwritten": "for (const k of ['console', 'tools', 'setTimeout', 'clearTimeout', 'text', 'json', 'yield_control', 'API']) { try { delete globalThis[k]; } catch (e) {} try { globalThis[k] = null; } catch (e) {} }",
    "decoy park property on globalThis": f"for (let i = 0; i < 4; i++) Object.defineProperty(globalThis, '__cellblock_controller_' + i, {GETTER});",
}

#: What the program does after the tampering: output, a tool call, a timer, an API read, a value.
USE = (
    'console.log("use", {a: [1, 2]}, new Error("logged")); text({b: 1}); json([1, {c: 2}]);'
    ' const echoed = await tools.echo({n: 1}); setTimeout(() => text("timer ran"), 1); const files = await API.list();'
)
ENDINGS = {
    "value": USE + " return {ok: true, echoed, files};",
    "throw": USE + ' throw new TypeError("the program failed on purpose");',
    # JSON.stringify throws on a BigInt: the value takes the controller's fallback path.
    "unrenderable value": USE + " return {big: 10n};",
}
PARK = 'await yield_control("park");'
PLACES = ("top level", "before a park", "after the resume")


#: Values that reach the controller's output and value paths: thrown, returned, logged.
VALUES: dict[str, str] = {
    "thrown Proxy": f"throw new Proxy({{}}, {PROXY_TRAPS});",
    "thrown Proxy of an Error": f"throw new Proxy(new Error('x'), {PROXY_TRAPS});",
    "thrown object with throwing toString/toJSON": f"throw {{ toString: {THROWER}, toJSON: {THROWER}, [Symbol.toPrimitive]: {THROWER} }};",
    "thrown Error with throwing name/message/stack getters": f"const e = new Error('x'); for (const k of ['name', 'message', 'stack']) Object.defineProperty(e, k, {GETTER}); throw e;",
    "thrown Symbol": "throw Symbol('s');",
    "thrown revoked Proxy": "const r = Proxy.revocable({}, {}); r.revoke(); throw r.proxy;",
    "returned Proxy": f"return new Proxy({{}}, {PROXY_TRAPS});",
    "returned value with throwing toJSON": f"return {{ toJSON: {THROWER} }};",
    "returned value with throwing toJSON and toString": f"return {{ toJSON: {THROWER}, toString: {THROWER}, [Symbol.toPrimitive]: {THROWER} }};",
    "returned value with a throwing getter": f"return Object.defineProperty({{}}, 'x', {{ enumerable: true, ...{GETTER} }});",
    "returned revoked Proxy": "const r = Proxy.revocable({}, {}); r.revoke(); return r.proxy;",
    "returned thenable whose then throws": f"return {{ then: {THROWER} }};",
    "tool result with a throwing getter": f"const r = await tools.echo({{n: 1}}); Object.defineProperty(r, 'n', {{ enumerable: true, ...{GETTER} }}); return r;",
    "logged hostile values": (
        f"const p = new Proxy({{}}, {PROXY_TRAPS}); const t = {{ toJSON: {THROWER}, toString: {THROWER} }};"
        " for (const v of [p, t]) { try { console.log(v, 'x'); } catch (e) {} try { text(v); } catch (e) {} try { json(v); } catch (e) {} }"
        " return 'logged';"
    ),
    "tool input with a throwing getter": f"try {{ await tools.echo(Object.defineProperty({{}}, 'x', {{ enumerable: true, ...{GETTER} }})); }} catch (e) {{}} return 'sent';",
    "tool input Proxy": f"try {{ await tools.echo(new Proxy({{}}, {PROXY_TRAPS})); }} catch (e) {{}} return 'sent';",
}


#: Allocates until the engine refuses, catches that, then allocates on (SPEC §10.10 item 1: still R09).
CAUGHT_OOM = "const a = []; try { for (;;) a.push({x: a.length}); } catch (e) {} const b = []; for (let i = 0; i < 1e7; i++) b.push('y' + i); return b.length;"


def program(tampering: str, place: str, ending: str) -> str:
    """The program running ``tampering`` at ``place`` (one of PLACES), then ``ending``."""
    if place == "top level":
        return f"{tampering}\n{ending}"
    if place == "before a park":
        return f"{tampering}\n{PARK}\n{ending}"
    return f"{PARK}\n{tampering}\n{ending}"
