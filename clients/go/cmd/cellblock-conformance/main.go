// Command cellblock-conformance runs one conformance scenario with the Go client and prints one JSON object.
//
//	cellblock-conformance <scenario> <address> [--spec clients/conformance/scenarios.json]
//
// Scenarios, handlers and the printed shape: clients/README.md ("Conformance table"). The Python
// and TypeScript CLIs implement the same list; tests/integration/test_client_conformance.py
// compares the three. Exit codes: 0 observations printed, 1 the scenario failed, 2 bad usage.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"cellblock/clients/go/cellblock"
	pb "cellblock/clients/go/gen/cellblockv1"
)

type spec struct {
	Tools    []cellblock.ToolSpec `json:"tools"`
	Programs map[string]string    `json:"programs"`
	Limits   map[string]struct {
		TimeoutMs        *int64 `json:"timeoutMs"`
		MaxSnapshotBytes *int64 `json:"maxSnapshotBytes"`
	} `json:"limits"`
}

type obj = map[string]any

type scenario struct {
	c        *cellblock.Client
	address  string
	spec     spec
	name     string
	scope    cellblock.Scope
	execID   string
	mu       sync.Mutex
	calls    []obj
	streamed []json.RawMessage
	gates    map[int]chan struct{} // `slow` call i answers once gate i closes (suspend_resume)
	gateOnce [3]sync.Once
}

func (s *scenario) open(i int) { s.gateOnce[i].Do(func() { close(s.gates[i]) }) }

func (s *scenario) program() string { return s.spec.Programs[s.name] }

func (s *scenario) register(ctx context.Context, scope cellblock.Scope) (obj, error) {
	cat, err := s.c.PutCatalog(ctx, scope, s.spec.Tools)
	if err != nil {
		return nil, err
	}
	ids := []string{}
	for _, e := range cat.GetEntries() {
		ids = append(ids, e.GetId())
	}
	return obj{"ids": ids, "catalogSize": cat.GetTelemetry().GetCatalogSize()}, nil
}

func (s *scenario) record(call cellblock.ToolCallInfo, input json.RawMessage) {
	n, _ := strconv.Atoi(call.NestedCallID[strings.LastIndex(call.NestedCallID, "_")+1:])
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, obj{
		"catalogId": call.CatalogID, "source": call.Source, "owner": call.Owner, "name": call.Name,
		"method": call.Method, "input": input, "n": n, "idsWellFormed": idsWellFormed(s.execID, call),
	})
}

var unsafeIDChars = regexp.MustCompile(`[^A-Za-z0-9_-]`)

func idsWellFormed(execID string, call cellblock.ToolCallInfo) bool {
	prefix := unsafeIDChars.ReplaceAllString(execID, "_")
	if len(prefix) > 48 {
		prefix = prefix[:48]
	}
	replay := regexp.MustCompile(`^replay_[0-9a-f]{24}$`).MatchString(call.ReplayID)
	run := regexp.MustCompile(`^run_[0-9a-f]{32}$`).MatchString(call.RunID)
	if !replay || !run || call.ParentToolCallID != execID {
		return false
	}
	nested := regexp.MustCompile(`^cellblock_` + regexp.QuoteMeta(prefix) + `_` + call.ReplayID[7:15] + `_[1-9][0-9]*$`)
	return nested.MatchString(call.NestedCallID)
}

type refusal = cellblock.ToolRefusal

// handlers are the shared tool handlers of clients/README.md; `unserved` deliberately has none.
func (s *scenario) handlers(overrides cellblock.Handlers) cellblock.Handlers {
	type numbered struct {
		N *float64 `json:"n"`
		I *float64 `json:"i"`
	}
	num2 := func(p *float64) float64 {
		if p == nil {
			return 0
		}
		return *p
	}
	num := func(p *float64) string {
		if p == nil {
			return "undefined"
		}
		return strconv.FormatFloat(*p, 'f', -1, 64)
	}
	table := cellblock.Handlers{
		"echo": func(_ context.Context, input json.RawMessage, _ cellblock.ToolCallInfo) (any, error) {
			return obj{"content": []obj{{"type": "text", "text": "echo"}}, "details": obj{"echo": input}}, nil
		},
		"boom": cellblock.Typed(func(_ context.Context, in numbered, _ cellblock.ToolCallInfo) (any, error) {
			return nil, errors.New("boom " + num(in.N))
		}),
		"refuse": cellblock.Typed(func(_ context.Context, in numbered, _ cellblock.ToolCallInfo) (any, error) {
			return nil, &refusal{Kind: "invalid_input", Message: "n must be positive, got " + num(in.N)}
		}),
		"blocked": func(context.Context, json.RawMessage, cellblock.ToolCallInfo) (any, error) {
			return nil, &refusal{Kind: "blocked", Message: "needs approval"}
		},
		"cancelled": func(context.Context, json.RawMessage, cellblock.ToolCallInfo) (any, error) {
			return nil, &refusal{Kind: "cancelled", Message: "operator cancelled"}
		},
		"silent": func(context.Context, json.RawMessage, cellblock.ToolCallInfo) (any, error) {
			return nil, &refusal{Kind: "failed", Message: ""}
		},
		"huge": cellblock.Typed(func(_ context.Context, in struct{ Bytes int }, _ cellblock.ToolCallInfo) (any, error) {
			return obj{"details": obj{"blob": strings.Repeat("x", in.Bytes)}}, nil
		}),
		"slow": cellblock.Typed(func(ctx context.Context, in numbered, _ cellblock.ToolCallInfo) (any, error) {
			gate, ok := s.gates[int(num2(in.I))]
			if !ok {
				return nil, errors.New("no gate for this call")
			}
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return obj{"details": obj{"answer": "late-" + num(in.I)}}, nil
		}),
		"lookup": cellblock.Typed(func(_ context.Context, in struct{ Key string }, _ cellblock.ToolCallInfo) (any, error) {
			if in.Key == "bad-shape" {
				return obj{"details": obj{"value": 42}}, nil
			}
			return obj{"details": obj{"value": "v-" + in.Key}}, nil
		}),
	}
	for name, h := range overrides {
		table[name] = h
	}
	recorded := cellblock.Handlers{}
	for name, h := range table {
		h := h
		recorded[name] = func(ctx context.Context, input json.RawMessage, call cellblock.ToolCallInfo) (any, error) {
			s.record(call, input)
			return h(ctx, input, call)
		}
	}
	return recorded
}

func (s *scenario) legOptions(h cellblock.Handlers) cellblock.LegOptions {
	return cellblock.LegOptions{Handlers: h, OnOutput: func(e cellblock.OutputEntry) {
		s.mu.Lock()
		s.streamed = append(s.streamed, append(json.RawMessage{}, e...))
		s.mu.Unlock()
		var entry struct{ Type, Text string }
		if json.Unmarshal(e, &entry) == nil && entry.Type == "text" && entry.Text == "after late-1" {
			s.open(2) // the second late result goes out on the open wait stream
		}
	}}
}

// exec runs the scenario's program as an exec leg with its limits (scenarios.json), recording its output.
func (s *scenario) exec(ctx context.Context, h cellblock.Handlers) (*cellblock.RunResult, error) {
	var limits *pb.LimitOverrides
	if given, ok := s.spec.Limits[s.name]; ok {
		limits = &pb.LimitOverrides{TimeoutMs: given.TimeoutMs, MaxSnapshotBytes: given.MaxSnapshotBytes}
	}
	return s.c.Exec(ctx, s.scope, cellblock.ExecOptions{LegOptions: s.legOptions(h), ToolCallID: s.execID, Code: s.program(), Limits: limits})
}

func (s *scenario) wait(ctx context.Context, runID string, h cellblock.Handlers) (*cellblock.RunResult, error) {
	return s.c.Wait(ctx, s.scope, cellblock.WaitOptions{LegOptions: s.legOptions(h), ToolCallID: s.execID + "-wait", RunID: runID})
}

// execWaiting runs the scenario's program, which must return waiting.
func (s *scenario) execWaiting(ctx context.Context, h cellblock.Handlers) (*cellblock.RunResult, error) {
	first, err := s.exec(ctx, h)
	if err != nil {
		return nil, err
	}
	if first.Status != "waiting" {
		return nil, fmt.Errorf("expected waiting: %s", first.ResultJSON)
	}
	return first, nil
}

// registerAndExec registers the catalog, runs the scenario's program with the shared handlers
// and returns the observation of its single leg.
func (s *scenario) registerAndExec(ctx context.Context) (obj, error) {
	if _, err := s.register(ctx, s.scope); err != nil {
		return nil, err
	}
	r, err := s.exec(ctx, s.handlers(nil))
	if err != nil {
		return nil, err
	}
	return leg(r)
}

func (s *scenario) streamedList() []json.RawMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]json.RawMessage{}, s.streamed...)
}

func (s *scenario) callList() []obj {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]obj{}, s.calls...)
}

// leg is the observation of one leg's Result (clients/README.md `leg`).
func leg(r *cellblock.RunResult) (obj, error) {
	dec := json.NewDecoder(bytes.NewReader(r.Body))
	dec.UseNumber()
	var body obj
	if err := dec.Decode(&body); err != nil {
		return nil, fmt.Errorf("result_json is not an object: %w", err)
	}
	if _, ok := body["runId"]; ok {
		body["runId"] = "<run>"
	}
	if t, ok := body["telemetry"].(map[string]any); ok {
		if _, ok := t["counterScope"]; ok {
			t["counterScope"] = "<scope>"
		}
	}
	calls := r.Metadata.GetBridgeCalls()
	return obj{
		"result": body, "status": r.Status, "code": r.Code, "runIdSet": r.RunID != "",
		"legCount":    r.Metadata.GetLegCount(),
		"bridgeCalls": obj{"search": calls.GetSearch(), "describe": calls.GetDescribe(), "call": calls.GetCall()},
	}, nil
}

// legsOf is the observation of each leg (leg), in order.
func legsOf(results ...*cellblock.RunResult) ([]obj, error) {
	out := make([]obj, len(results))
	for i, r := range results {
		o, err := leg(r)
		if err != nil {
			return nil, err
		}
		out[i] = o
	}
	return out, nil
}

func statusOf(err error) obj {
	if err == nil {
		return obj{"code": "OK", "message": ""}
	}
	code, message := cellblock.StatusName(err)
	return obj{"code": code, "message": message}
}

var runStates = map[pb.RunState]string{pb.RunState_RUN_STATE_RUNNING: "running", pb.RunState_RUN_STATE_SUSPENDED: "suspended", pb.RunState_RUN_STATE_UNSPECIFIED: "unspecified"}

func lastNumber(id string) int {
	n, _ := strconv.Atoi(id[strings.LastIndex(id, "_")+1:])
	return n
}

// waitRefusedMaxWaits bounds the waits of wait_refused until the run completes; a lost tool call answers `waiting` every time.
const waitRefusedMaxWaits = 3

var scenarios = map[string]func(ctx context.Context, s *scenario) (obj, error){
	"main_job": func(ctx context.Context, s *scenario) (obj, error) {
		catalog, err := s.register(ctx, s.scope)
		if err != nil {
			return nil, err
		}
		surface, err := s.c.ToolSurface(ctx, s.scope, "")
		if err != nil {
			return nil, err
		}
		names, sizes := []string{}, []int{}
		for _, t := range surface.GetTools() {
			names = append(names, t.GetName())
			sizes = append(sizes, len(t.GetDescription()))
		}
		var params json.RawMessage
		if tools := surface.GetTools(); len(tools) > 0 {
			params = json.RawMessage(tools[0].GetParametersJson())
		}
		r, err := s.exec(ctx, s.handlers(nil))
		if err != nil {
			return nil, err
		}
		l, err := leg(r)
		return obj{
			"catalog": catalog,
			"surface": obj{"engaged": surface.GetCodeModeEngaged(), "names": names, "execParameters": params, "descriptionBytes": sizes},
			"leg":     l, "calls": s.callList(), "streamed": s.streamedList(),
		}, err
	},
	"tool_errors": func(ctx context.Context, s *scenario) (obj, error) {
		l, err := s.registerAndExec(ctx)
		return obj{"leg": l, "calls": s.callList()}, err
	},
	"result_over_message_cap": func(ctx context.Context, s *scenario) (obj, error) {
		l, err := s.registerAndExec(ctx)
		return obj{"leg": l, "calls": s.callList()}, err
	},
	"uncaught_refusal": func(ctx context.Context, s *scenario) (obj, error) {
		l, err := s.registerAndExec(ctx)
		return obj{"leg": l, "calls": s.callList()}, err
	},
	"output_stream": func(ctx context.Context, s *scenario) (obj, error) {
		l, err := s.registerAndExec(ctx)
		return obj{"leg": l, "streamed": s.streamedList()}, err
	},
	"suspend_resume": func(ctx context.Context, s *scenario) (obj, error) {
		if _, err := s.register(ctx, s.scope); err != nil {
			return nil, err
		}
		h := s.handlers(nil)
		first, err := s.execWaiting(ctx, h)
		if err != nil {
			return nil, err
		}
		run, err := s.c.GetRun(ctx, s.scope, first.RunID)
		if err != nil {
			return nil, err
		}
		s.open(1) // finishes between the legs: sent right after the Wait start
		second, err := s.wait(ctx, first.RunID, h)
		if err != nil {
			return nil, err
		}
		pending := []obj{}
		for _, p := range run.GetPendingToolCalls() {
			pending = append(pending, obj{"id": p.GetId(), "method": p.GetMethod(), "dispatched": p.GetNestedCallId() != ""})
		}
		l1, err := leg(first)
		if err != nil {
			return nil, err
		}
		l2, err := leg(second)
		return obj{
			"first":  l1,
			"run":    obj{"state": runStates[run.GetState()], "snapshotStored": run.GetSnapshotBytes() > 0, "expires": run.GetExpireTime() != nil, "pending": pending},
			"second": l2, "calls": s.callList(), "streamed": s.streamedList(),
		}, err
	},
	"yield_resume": func(ctx context.Context, s *scenario) (obj, error) {
		if _, err := s.register(ctx, s.scope); err != nil {
			return nil, err
		}
		first, err := s.exec(ctx, s.handlers(nil))
		if err != nil {
			return nil, err
		}
		second, err := s.wait(ctx, first.RunID, nil)
		if err != nil {
			return nil, err
		}
		l1, err := leg(first)
		if err != nil {
			return nil, err
		}
		l2, err := leg(second)
		return obj{"first": l1, "second": l2}, err
	},
	"cancel_message": func(ctx context.Context, s *scenario) (obj, error) {
		if _, err := s.register(ctx, s.scope); err != nil {
			return nil, err
		}
		cancel := make(chan struct{})
		var once sync.Once
		notices := []int{}
		hold := func(hctx context.Context, _ json.RawMessage, _ cellblock.ToolCallInfo) (any, error) {
			once.Do(func() { close(cancel) }) // sends Cancel on the Exec stream
			<-hctx.Done()
			return nil, hctx.Err()
		}
		o := s.legOptions(s.handlers(cellblock.Handlers{"hold": hold}))
		o.Cancel = cancel
		o.OnToolCallCancelled = func(id string) { notices = append(notices, lastNumber(id)) }
		r, err := s.c.Exec(ctx, s.scope, cellblock.ExecOptions{LegOptions: o, ToolCallID: s.execID, Code: s.program()})
		if err != nil {
			return nil, err
		}
		l, err := leg(r)
		return obj{"leg": l, "calls": s.callList(), "streamed": s.streamedList(), "cancelNotices": notices}, err
	},
	"cancel_running": func(ctx context.Context, s *scenario) (obj, error) {
		if _, err := s.register(ctx, s.scope); err != nil {
			return nil, err
		}
		type outcome struct {
			state pb.RunState
			err   error
		}
		cancels := make(chan outcome, 4)
		hold := func(hctx context.Context, _ json.RawMessage, call cellblock.ToolCallInfo) (any, error) {
			go func() { // CancelRun outlives this handler, which the abort abandons
				state, err := s.c.CancelRun(ctx, s.scope, call.RunID)
				cancels <- outcome{state, err}
			}()
			<-hctx.Done()
			return nil, hctx.Err()
		}
		r, err := s.exec(ctx, s.handlers(cellblock.Handlers{"hold": hold}))
		if err != nil {
			return nil, err
		}
		got := <-cancels
		if got.err != nil {
			return nil, got.err
		}
		l, err := leg(r)
		return obj{"leg": l, "previousState": []string{runStates[got.state]}, "calls": s.callList(), "streamed": s.streamedList()}, err
	},
	"cancel_suspended": func(ctx context.Context, s *scenario) (obj, error) {
		if _, err := s.register(ctx, s.scope); err != nil {
			return nil, err
		}
		first, err := s.exec(ctx, s.handlers(nil))
		if err != nil {
			return nil, err
		}
		previous, err := s.c.CancelRun(ctx, s.scope, first.RunID)
		if err != nil {
			return nil, err
		}
		again, err := s.c.CancelRun(ctx, s.scope, first.RunID)
		if err != nil {
			return nil, err
		}
		waited, err := s.wait(ctx, first.RunID, nil)
		if err != nil {
			return nil, err
		}
		_, afterErr := s.c.GetRun(ctx, s.scope, first.RunID)
		l1, err := leg(first)
		if err != nil {
			return nil, err
		}
		l2, err := leg(waited)
		return obj{"first": l1, "previousState": runStates[previous], "cancelAgain": runStates[again], "wait": l2, "getRunAfter": statusOf(afterErr)["code"]}, err
	},
	"admission": func(ctx context.Context, s *scenario) (obj, error) {
		if _, err := s.register(ctx, s.scope); err != nil {
			return nil, err
		}
		other := cellblock.Scope{SessionID: s.scope.SessionID, AgentRunID: s.name + "-other"}
		if _, err := s.register(ctx, other); err != nil {
			return nil, err
		}
		refused := []obj{}
		hold := func(hctx context.Context, _ json.RawMessage, _ cellblock.ToolCallInfo) (any, error) {
			_, err := s.c.Exec(hctx, other, cellblock.ExecOptions{ToolCallID: "call-other", Code: "return 2;"})
			refused = append(refused, statusOf(err))
			return obj{"details": obj{"released": true}}, nil
		}
		r, err := s.exec(ctx, s.handlers(cellblock.Handlers{"hold": hold}))
		if err != nil {
			return nil, err
		}
		l, err := leg(r)
		return obj{"refused": refused, "leg": l, "calls": s.callList()}, err
	},
	"wait_refused": func(ctx context.Context, s *scenario) (obj, error) {
		if _, err := s.register(ctx, s.scope); err != nil {
			return nil, err
		}
		released := make(chan struct{})
		hold := func(hctx context.Context, _ json.RawMessage, _ cellblock.ToolCallInfo) (any, error) {
			select {
			case <-released:
				return obj{"details": obj{"answer": "released"}}, nil
			case <-hctx.Done():
				return nil, hctx.Err()
			}
		}
		h := s.handlers(cellblock.Handlers{"hold": hold})
		first, err := s.execWaiting(ctx, h)
		if err != nil {
			return nil, err
		}
		other := cellblock.Scope{SessionID: s.scope.SessionID + "-other", AgentRunID: s.scope.AgentRunID}
		refused, err := s.c.Wait(ctx, other, cellblock.WaitOptions{LegOptions: s.legOptions(h), ToolCallID: s.execID + "-other", RunID: first.RunID})
		if err != nil {
			return nil, err
		}
		close(released) // answers while no wait is open: the result waits in the client for the owner's wait
		waits, final := 0, first
		for final.Status == "waiting" && waits < waitRefusedMaxWaits {
			waits++
			if final, err = s.wait(ctx, first.RunID, h); err != nil {
				return nil, err
			}
		}
		l1, err := leg(first)
		if err != nil {
			return nil, err
		}
		l2, err := leg(refused)
		if err != nil {
			return nil, err
		}
		l3, err := leg(final)
		return obj{"first": l1, "refused": l2, "final": l3, "waits": waits, "calls": s.callList()}, err
	},
	"second_wait": func(ctx context.Context, s *scenario) (obj, error) {
		if _, err := s.register(ctx, s.scope); err != nil {
			return nil, err
		}
		released := make(chan struct{})
		second := make(chan obj, 1)
		hold := func(hctx context.Context, input json.RawMessage, call cellblock.ToolCallInfo) (any, error) {
			var in struct {
				Step int `json:"step"`
			}
			_ = json.Unmarshal(input, &in)
			if in.Step == 1 {
				select {
				case <-released:
				case <-hctx.Done():
					return nil, hctx.Err()
				}
			} else {
				// Runs on the open wait's leg: a second wait on the run now must be refused and change nothing.
				r, err := s.c.Wait(ctx, s.scope, cellblock.WaitOptions{ToolCallID: s.execID + "-second", RunID: call.RunID})
				o := statusOf(err)
				if err == nil {
					if o, err = leg(r); err != nil {
						return nil, err
					}
				}
				second <- o
			}
			return obj{"details": obj{"answer": fmt.Sprintf("released-%d", in.Step)}}, nil
		}
		h := s.handlers(cellblock.Handlers{"hold": hold})
		first, err := s.execWaiting(ctx, h)
		if err != nil {
			return nil, err
		}
		close(released) // answers between the legs: sent right after the wait's start
		resumed, err := s.wait(ctx, first.RunID, h)
		if err != nil {
			return nil, err
		}
		legs, err := legsOf(first, resumed)
		if err != nil {
			return nil, err
		}
		out := obj{"first": legs[0], "second": obj{}, "resumed": legs[1], "calls": s.callList()}
		select {
		case o := <-second:
			out["second"] = o
		default:
		}
		return out, nil
	},
	"grpc_status": func(ctx context.Context, s *scenario) (obj, error) {
		blank := cellblock.Scope{SessionID: " ", AgentRunID: "x"}
		fresh := cellblock.Scope{SessionID: s.scope.SessionID, AgentRunID: s.name + "-fresh"}
		missing := "run_" + strings.Repeat("0", 32)
		out := obj{}
		_, err := s.c.PutCatalog(ctx, blank, s.spec.Tools)
		out["putCatalogBlankScope"] = statusOf(err)
		_, err = s.c.PutCatalog(ctx, s.scope, []cellblock.ToolSpec{{Source: "host", Name: "broken", Parameters: json.RawMessage(`{"type":12}`)}})
		out["putCatalogBadSchema"] = statusOf(err)
		_, err = s.c.GetCatalog(ctx, fresh)
		out["getCatalogMissing"] = statusOf(err)
		_, err = s.c.Catalogs.ListCatalogs(ctx, &pb.ListCatalogsRequest{SessionId: ""})
		out["listCatalogsBlankSession"] = statusOf(err)
		_, err = s.c.Exec(ctx, fresh, cellblock.ExecOptions{ToolCallID: "call-none", Code: s.program()})
		out["execWithoutCatalog"] = statusOf(err)
		_, err = s.c.GetRun(ctx, s.scope, missing)
		out["getRunUnknown"] = statusOf(err)
		_, err = s.c.CancelRun(ctx, s.scope, missing)
		out["cancelRunUnknown"] = statusOf(err)
		if _, err := s.register(ctx, s.scope); err != nil {
			return nil, err
		}
		// A stream whose first message is not its start: only the generated stubs can send that.
		notStart := &pb.ToolResult{NestedCallId: "x", Outcome: &pb.ToolResult_OkJson{OkJson: "{}"}}
		out["execFirstMessageNotStart"] = statusOf(rawLegStatus(ctx, s.c, true, notStart))
		out["waitFirstMessageNotStart"] = statusOf(rawLegStatus(ctx, s.c, false, notStart))
		out["execClosedBeforeStart"] = statusOf(rawLegStatus(ctx, s.c, true, nil))
		r, err := s.c.Exec(ctx, s.scope, cellblock.ExecOptions{ToolCallID: "call-bad-args", ArgumentsJSON: `{"code":5}`})
		if err != nil {
			return nil, err
		}
		out["execBadArguments"], err = leg(r)
		return out, err
	},
}

// rawLegStatus opens a raw Exec or Wait stream whose first message is `first` (nil: none
// at all, the Exec stream is closed at once) and returns the stream's final status.
func rawLegStatus(ctx context.Context, c *cellblock.Client, exec bool, first *pb.ToolResult) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var recv func() error
	if exec {
		st, err := c.CodeMode.Exec(ctx)
		if err != nil {
			return err
		}
		if first != nil {
			if err := st.Send(&pb.ExecRequest{Message: &pb.ExecRequest_ToolResult{ToolResult: first}}); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
		}
		_ = st.CloseSend()
		recv = func() error { _, err := st.Recv(); return err }
	} else {
		st, err := c.CodeMode.Wait(ctx)
		if err != nil {
			return err
		}
		if err := st.Send(&pb.WaitRequest{Message: &pb.WaitRequest_ToolResult{ToolResult: first}}); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		_ = st.CloseSend()
		recv = func() error { _, err := st.Recv(); return err }
	}
	for {
		if err := recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(argv []string) int {
	specPath := "clients/conformance/scenarios.json"
	var args []string
	for i := 0; i < len(argv); i++ {
		if argv[i] == "--spec" && i+1 < len(argv) {
			specPath = argv[i+1]
			i++
			continue
		}
		args = append(args, argv[i])
	}
	names := []string{}
	for n := range scenarios {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(args) != 2 || scenarios[args[0]] == nil {
		fmt.Fprintf(os.Stderr, "usage: cellblock-conformance <%s> <address> [--spec file]\n", strings.Join(names, "|"))
		return 2
	}
	raw, err := os.ReadFile(specPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		return 2
	}
	var sp spec
	if err := json.Unmarshal(raw, &sp); err != nil {
		fmt.Fprintln(os.Stderr, "conformance: bad spec:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dialCtx, dialCancel := context.WithTimeout(ctx, 10*time.Second)
	defer dialCancel()
	c, err := cellblock.Dial(dialCtx, args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		return 1
	}
	defer c.Close()
	s := &scenario{
		c: c, address: args[1], spec: sp, name: args[0], gates: map[int]chan struct{}{1: make(chan struct{}), 2: make(chan struct{})},
		scope:  cellblock.Scope{SessionID: fmt.Sprintf("conf-go-%d", os.Getpid()), AgentRunID: args[0]},
		execID: "call-" + args[0],
	}
	defer func() { _, _ = c.DeleteCatalog(context.Background(), s.scope) }()
	observed, err := scenarios[args[0]](ctx, s)
	if err != nil {
		fmt.Fprintf(os.Stderr, "conformance: %s: %v\n", args[0], err)
		return 1
	}
	text, err := json.Marshal(observed)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		return 1
	}
	fmt.Println(string(text))
	return 0
}
