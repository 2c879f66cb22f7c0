// Package cellblock is a Go client of the cellblock code-mode service.
//
// The message and service types are generated from proto/cellblock/v1 into
// cellblock/clients/go/gen/cellblockv1 by Debian's protoc-gen-go and
// protoc-gen-go-grpc (scripts/gen-proto.sh). This package adds what every
// runtime needs on top of them: catalogs from SPEC §3.2 tool specs, exec and
// wait legs whose nested calls are served by handlers (each in its own
// goroutine), results of calls that settle after a leg returned "waiting"
// delivered on the run's next wait stream (SPEC §3.4 item 3), and cancellation
// by Cancel message or RunService.CancelRun.
//
//	c, err := cellblock.Dial(ctx, "127.0.0.1:50051")
//	_, err = c.PutCatalog(ctx, scope, tools)
//	res, err := c.Exec(ctx, scope, cellblock.ExecOptions{ToolCallID: "call_1", Code: src, Handlers: h})
//	for err == nil && res.Status == "waiting" {
//		res, err = c.Wait(ctx, scope, cellblock.WaitOptions{ToolCallID: "call_2", RunID: res.RunID, Handlers: h})
//	}
package cellblock

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	pb "cellblock/clients/go/gen/cellblockv1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// Scope is one agent run inside one session; both ids are required.
type Scope struct {
	SessionID  string
	AgentRunID string
}

func (s Scope) proto() *pb.Scope { return &pb.Scope{SessionId: s.SessionID, AgentRunId: s.AgentRunID} }

// ToolSpec is one tool as SPEC §3.2 writes it (the JSON shape of clients/conformance/scenarios.json).
type ToolSpec struct {
	Source        string          `json:"source"`
	Owner         string          `json:"owner,omitempty"`
	Name          string          `json:"name"`
	Label         string          `json:"label,omitempty"`
	Description   string          `json:"description,omitempty"`
	Parameters    json.RawMessage `json:"parameters,omitempty"`
	OutputSchema  json.RawMessage `json:"outputSchema,omitempty"`
	ReplaySafe    bool            `json:"replaySafe,omitempty"`
	SideEffecting bool            `json:"sideEffecting,omitempty"`
	DirectOnly    bool            `json:"directOnly,omitempty"`
	Operation     string          `json:"operation,omitempty"`
}

var sources = map[string]pb.ToolSource{"host": pb.ToolSource_TOOL_SOURCE_HOST, "mcp": pb.ToolSource_TOOL_SOURCE_MCP, "client": pb.ToolSource_TOOL_SOURCE_CLIENT}
var operations = map[string]pb.McpOperation{
	"": pb.McpOperation_MCP_OPERATION_UNSPECIFIED, "tool": pb.McpOperation_MCP_OPERATION_TOOL,
	"resources.list": pb.McpOperation_MCP_OPERATION_RESOURCES_LIST, "resources.read": pb.McpOperation_MCP_OPERATION_RESOURCES_READ,
	"prompts.list": pb.McpOperation_MCP_OPERATION_PROMPTS_LIST, "prompts.get": pb.McpOperation_MCP_OPERATION_PROMPTS_GET,
}

func (t ToolSpec) proto() (*pb.Tool, error) {
	source, ok := sources[t.Source]
	if !ok {
		return nil, fmt.Errorf("tool %q: source must be host, mcp or client, not %q", t.Name, t.Source)
	}
	operation, ok := operations[t.Operation]
	if !ok {
		return nil, fmt.Errorf("tool %q: unknown operation %q", t.Name, t.Operation)
	}
	return &pb.Tool{
		Source: source, Owner: t.Owner, Name: t.Name, Label: t.Label, Description: t.Description,
		ParametersJson: compact(t.Parameters), OutputSchemaJson: compact(t.OutputSchema),
		ReplaySafe: t.ReplaySafe, SideEffecting: t.SideEffecting, DirectOnly: t.DirectOnly, Operation: operation,
	}, nil
}

// ToolCallInfo is the context of one nested call, passed to its handler.
type ToolCallInfo struct {
	NestedCallID     string // cellblock_<P>_<R>_<n>, unique within the run
	ParentToolCallID string // the tool-call id of the run's exec, in every leg
	RunID            string
	ReplayID         string
	CatalogID        string // e.g. host:core:lookup
	Source           string // host, mcp or client
	Owner            string
	Name             string
	Method           string // call, callValue or namespace
}

// Handler serves one nested call. Its ctx is cancelled when cellblock
// abandons the call or the run ends. The returned value (normally
// {"content": ..., "details": ...}) is sent as JSON; a *ToolRefusal error sends
// its kind and message, any other error kind "failed" with err.Error().
type Handler func(ctx context.Context, input json.RawMessage, call ToolCallInfo) (any, error)

// Typed adapts a handler with a typed input (decoded from the call's JSON) to Handler.
func Typed[I any](fn func(ctx context.Context, input I, call ToolCallInfo) (any, error)) Handler {
	return func(ctx context.Context, raw json.RawMessage, call ToolCallInfo) (any, error) {
		var input I
		if err := json.Unmarshal(raw, &input); err != nil {
			return nil, &ToolRefusal{Kind: "invalid_input", Message: fmt.Sprintf("input does not decode: %v", err)}
		}
		return fn(ctx, input, call)
	}
}

// Handlers maps catalog ids (preferred) or tool names to handlers.
type Handlers map[string]Handler

// ToolRefusal answers a nested call with an error of one kind: invalid_input,
// blocked, failed or cancelled (SPEC §3.5 item 5).
type ToolRefusal struct {
	Kind    string
	Message string
}

func (r *ToolRefusal) Error() string { return r.Kind + ": " + r.Message }

var kinds = map[string]pb.ToolErrorKind{
	"invalid_input": pb.ToolErrorKind_TOOL_ERROR_KIND_INVALID_INPUT, "blocked": pb.ToolErrorKind_TOOL_ERROR_KIND_BLOCKED,
	"failed": pb.ToolErrorKind_TOOL_ERROR_KIND_FAILED, "cancelled": pb.ToolErrorKind_TOOL_ERROR_KIND_CANCELLED,
}

var statusNames = []string{
	"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
	"PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
	"INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
}

// StatusName returns the canonical gRPC status name of err (e.g. NOT_FOUND) and its message.
func StatusName(err error) (string, string) {
	st, _ := status.FromError(err)
	if c := int(st.Code()); c >= 0 && c < len(statusNames) {
		return statusNames[c], st.Message()
	}
	return "UNKNOWN", st.Message()
}

// OutputEntry is one output entry as the service accepted it (compact JSON, SPEC §10.5).
type OutputEntry = json.RawMessage

// RunResult is the outcome of one leg. A failed run is a value: check Status.
type RunResult struct {
	Status     string          // completed, waiting or failed (the proto mirror)
	Code       string          // failed only, e.g. invalid_input; "" otherwise
	ResultJSON string          // the model-facing result; return it to the model verbatim
	Body       json.RawMessage // the same, for decoding
	RunID      string          // waiting only: pass it to Wait
	TraceID    string
	Metadata   *pb.RunMetadata
}

var runStatuses = map[pb.RunStatus]string{pb.RunStatus_RUN_STATUS_COMPLETED: "completed", pb.RunStatus_RUN_STATUS_WAITING: "waiting", pb.RunStatus_RUN_STATUS_FAILED: "failed"}

func resultOf(r *pb.Result) *RunResult {
	code := strings.ToLower(strings.TrimPrefix(r.GetCode().String(), "ERROR_CODE_"))
	if r.GetCode() == pb.ErrorCode_ERROR_CODE_UNSPECIFIED {
		code = ""
	}
	st, ok := runStatuses[r.GetStatus()]
	if !ok {
		st = "failed"
	}
	md := r.GetMetadata()
	if md == nil {
		md = &pb.RunMetadata{}
	}
	return &RunResult{Status: st, Code: code, ResultJSON: r.GetResultJson(), Body: json.RawMessage(r.GetResultJson()), RunID: r.GetRunId(), TraceID: r.GetTraceId(), Metadata: md}
}

// LegOptions are shared by Exec and Wait.
type LegOptions struct {
	Handlers Handlers
	// OnOutput is called with each output entry as the service accepts it.
	OnOutput func(OutputEntry)
	// Cancel, when closed, sends a Cancel message; the leg still returns its aborted result.
	Cancel <-chan struct{}
	// OnToolCallCancelled is called when cellblock abandons a dispatched call.
	OnToolCallCancelled func(nestedCallID string)
}

// ExecOptions starts an exec leg: Code, or the model's ArgumentsJSON verbatim.
type ExecOptions struct {
	LegOptions
	ToolCallID       string
	Code             string
	ArgumentsJSON    string
	TurnID           string
	ForceRestartSafe bool
	Limits           *pb.LimitOverrides
}

// WaitOptions starts a wait leg: RunID, or the model's ArgumentsJSON verbatim.
type WaitOptions struct {
	LegOptions
	ToolCallID    string
	RunID         string
	ArgumentsJSON string
}

// Client is safe for concurrent use.
type Client struct {
	conn       *grpc.ClientConn
	Catalogs   pb.CatalogServiceClient
	CodeMode   pb.CodeModeServiceClient
	Runs       pb.RunServiceClient
	RPCTimeout time.Duration

	mu   sync.Mutex
	runs map[string]*runCalls
}

// Dial connects (plaintext) to host:port or unix:/path and waits until the channel is ready or ctx ends.
func Dial(ctx context.Context, target string, opts ...grpc.DialOption) (*Client, error) {
	options := []grpc.DialOption{grpc.WithInsecure(), grpc.WithBlock()}
	if path := strings.TrimPrefix(target, "unix:"); path != target {
		options = append(options, grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}))
		target = "passthrough:///cellblock"
	}
	conn, err := grpc.DialContext(ctx, target, append(options, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("cellblock at %s is not reachable: %w", target, err)
	}
	return &Client{
		conn: conn, Catalogs: pb.NewCatalogServiceClient(conn), CodeMode: pb.NewCodeModeServiceClient(conn),
		Runs: pb.NewRunServiceClient(conn), RPCTimeout: 60 * time.Second, runs: map[string]*runCalls{},
	}, nil
}

// Close abandons every nested call still served and closes the connection.
func (c *Client) Close() error {
	c.mu.Lock()
	for id, run := range c.runs {
		run.abandonAll()
		delete(c.runs, id)
	}
	c.mu.Unlock()
	return c.conn.Close()
}

func (c *Client) unary(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.RPCTimeout)
}

// PutCatalog replaces the scope's catalog with tools (all-or-nothing). Use
// c.Catalogs.PutCatalog directly for merge mode, allow/deny or direct tools.
func (c *Client) PutCatalog(ctx context.Context, scope Scope, tools []ToolSpec) (*pb.Catalog, error) {
	req := &pb.PutCatalogRequest{Scope: scope.proto(), Mode: pb.RegistrationMode_REGISTRATION_MODE_REPLACE}
	for _, t := range tools {
		p, err := t.proto()
		if err != nil {
			return nil, err
		}
		req.Tools = append(req.Tools, p)
	}
	ctx, cancel := c.unary(ctx)
	defer cancel()
	resp, err := c.Catalogs.PutCatalog(ctx, req)
	return resp.GetCatalog(), err
}

// GetCatalog returns the scope's catalog; NOT_FOUND when it has none.
func (c *Client) GetCatalog(ctx context.Context, scope Scope) (*pb.Catalog, error) {
	ctx, cancel := c.unary(ctx)
	defer cancel()
	resp, err := c.Catalogs.GetCatalog(ctx, &pb.GetCatalogRequest{Scope: scope.proto()})
	return resp.GetCatalog(), err
}

// DeleteCatalog ends the scope: aborts its legs, discards its suspended runs, drops the catalog.
func (c *Client) DeleteCatalog(ctx context.Context, scope Scope) (*pb.DeleteCatalogResponse, error) {
	ctx, cancel := c.unary(ctx)
	defer cancel()
	return c.Catalogs.DeleteCatalog(ctx, &pb.DeleteCatalogRequest{Scope: scope.proto()})
}

// ToolSurface returns the model-visible tools of a scope for one model (SPEC §3.3).
func (c *Client) ToolSurface(ctx context.Context, scope Scope, modelID string) (*pb.GetToolSurfaceResponse, error) {
	ctx, cancel := c.unary(ctx)
	defer cancel()
	return c.CodeMode.GetToolSurface(ctx, &pb.GetToolSurfaceRequest{Scope: scope.proto(), ModelId: modelID})
}

// GetRun returns one run of the scope; NOT_FOUND when unknown, expired or another scope's.
func (c *Client) GetRun(ctx context.Context, scope Scope, runID string) (*pb.Run, error) {
	ctx, cancel := c.unary(ctx)
	defer cancel()
	resp, err := c.Runs.GetRun(ctx, &pb.GetRunRequest{Scope: scope.proto(), RunId: runID})
	return resp.GetRun(), err
}

// CancelRun aborts an active leg or discards a suspended run; it returns the state the run was in.
func (c *Client) CancelRun(ctx context.Context, scope Scope, runID string) (pb.RunState, error) {
	ctx, cancel := c.unary(ctx)
	defer cancel()
	resp, err := c.Runs.CancelRun(ctx, &pb.CancelRunRequest{Scope: scope.proto(), RunId: runID})
	if err != nil {
		return pb.RunState_RUN_STATE_UNSPECIFIED, err
	}
	c.mu.Lock()
	if run := c.runs[runID]; run != nil {
		run.abandonAll()
		delete(c.runs, runID)
	}
	c.mu.Unlock()
	return resp.GetPreviousState(), nil
}

// Exec runs one exec leg and serves its nested calls.
func (c *Client) Exec(ctx context.Context, scope Scope, o ExecOptions) (*RunResult, error) {
	args := o.ArgumentsJSON
	if args == "" {
		args = jsonText(map[string]string{"code": o.Code})
	}
	// The stream's own context: cancelled once the stream has ended (leg.release), or grpc-go
	// keeps its goroutine for as long as the caller's ctx lives.
	ctx, release := context.WithCancel(ctx)
	stream, err := c.CodeMode.Exec(ctx)
	if err != nil {
		release()
		return nil, err
	}
	start := &pb.ExecStart{Scope: scope.proto(), ToolCallId: o.ToolCallID, ArgumentsJson: args, TurnId: o.TurnID, ForceRestartSafe: o.ForceRestartSafe, LimitOverrides: o.Limits}
	l := &leg{
		start: func() error { return stream.Send(&pb.ExecRequest{Message: &pb.ExecRequest_Start{Start: start}}) },
		sendResult: func(r *pb.ToolResult) error {
			return stream.Send(&pb.ExecRequest{Message: &pb.ExecRequest_ToolResult{ToolResult: r}})
		},
		sendCancel: func() error {
			return stream.Send(&pb.ExecRequest{Message: &pb.ExecRequest_Cancel{Cancel: &pb.Cancel{Reason: "client cancelled the leg"}}})
		},
		recv:      func() (legResponse, error) { return stream.Recv() },
		closeSend: stream.CloseSend,
		release:   release,
	}
	return c.runLeg(l, "", o.LegOptions)
}

// Wait runs one wait leg; results of calls dispatched in earlier legs go out on it as they settle.
func (c *Client) Wait(ctx context.Context, scope Scope, o WaitOptions) (*RunResult, error) {
	args, runID := o.ArgumentsJSON, o.RunID
	if args == "" {
		args = jsonText(map[string]string{"runId": runID})
	} else {
		var parsed struct {
			RunID string `json:"runId"`
		}
		_ = json.Unmarshal([]byte(args), &parsed)
		runID = parsed.RunID
	}
	// The stream's own context: cancelled once the stream has ended (leg.release), or grpc-go
	// keeps its goroutine for as long as the caller's ctx lives.
	ctx, release := context.WithCancel(ctx)
	stream, err := c.CodeMode.Wait(ctx)
	if err != nil {
		release()
		return nil, err
	}
	start := &pb.WaitStart{Scope: scope.proto(), ToolCallId: o.ToolCallID, ArgumentsJson: args}
	l := &leg{
		start: func() error { return stream.Send(&pb.WaitRequest{Message: &pb.WaitRequest_Start{Start: start}}) },
		sendResult: func(r *pb.ToolResult) error {
			return stream.Send(&pb.WaitRequest{Message: &pb.WaitRequest_ToolResult{ToolResult: r}})
		},
		sendCancel: func() error {
			return stream.Send(&pb.WaitRequest{Message: &pb.WaitRequest_Cancel{Cancel: &pb.Cancel{Reason: "client cancelled the leg"}}})
		},
		recv:      func() (legResponse, error) { return stream.Recv() },
		closeSend: stream.CloseSend,
		release:   release,
	}
	return c.runLeg(l, runID, o.LegOptions)
}

// legResponse is what ExecResponse and WaitResponse have in common.
type legResponse interface {
	GetToolCall() *pb.ToolCall
	GetOutput() *pb.OutputEvent
	GetToolCallCancelled() *pb.ToolCallCancelled
	GetResult() *pb.Result
}

// leg is one open Exec or Wait stream. Every Send goes through the writer goroutine.
type leg struct {
	start      func() error
	sendResult func(*pb.ToolResult) error
	sendCancel func() error
	recv       func() (legResponse, error)
	closeSend  func() error
	release    context.CancelFunc // cancels the stream's context

	mu     sync.Mutex
	open   bool
	outbox chan func() error

	sent []*pb.ToolResult // results written on this leg, resent if it suspends or is refused; guarded by Client.mu
}

// push queues a write; false once the leg has ended.
func (l *leg) push(write func() error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.open {
		return false
	}
	l.outbox <- write
	return true
}

func (l *leg) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open {
		l.open = false
		close(l.outbox)
	}
}

// runCalls are the nested calls of one run this client serves, across its legs.
type runCalls struct {
	id          string
	inFlight    map[string]context.CancelFunc
	undelivered []*pb.ToolResult // finished while no leg of the run was open
	// legs are the run's open legs, oldest first; results go out on the first. Two are open
	// when a second wait races the one serving the run: the service refuses one of them
	// (SPEC §5.2 item 5, [W06]), and the refusal hands the run to the other, never away from it.
	legs []*leg
}

func (r *runCalls) abandonAll() {
	for _, cancel := range r.inFlight {
		cancel()
	}
	r.inFlight = map[string]context.CancelFunc{}
	r.undelivered = nil
	for _, l := range r.legs {
		l.sent = nil
	}
}

func (c *Client) runLeg(l *leg, waitRunID string, o LegOptions) (*RunResult, error) {
	l.open, l.outbox = true, make(chan func() error, 1024)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for write := range l.outbox {
			if err := write(); err != nil {
				break // the read side reports the stream's status
			}
		}
		for range l.outbox {
		}
		_ = l.closeSend()
	}()
	defer func() { l.end(); <-writerDone }()
	l.push(l.start)
	var run *runCalls
	if waitRunID != "" {
		run = c.attach(waitRunID, l)
	}
	stopCancel := make(chan struct{})
	defer close(stopCancel)
	if o.Cancel != nil {
		go func() {
			select {
			case <-o.Cancel:
				l.push(l.sendCancel)
			case <-stopCancel:
			}
		}()
	}
	for {
		msg, err := l.recv()
		if err != nil {
			l.release()
			if run != nil {
				c.failLeg(run, l)
			}
			if errors.Is(err, io.EOF) {
				return nil, errors.New("the service closed the stream without a Result")
			}
			return nil, err
		}
		switch {
		case msg.GetToolCall() != nil:
			tc := msg.GetToolCall()
			if run == nil || run.id != tc.GetRunId() {
				run = c.attach(tc.GetRunId(), l)
			}
			c.dispatch(run, tc, o.Handlers)
		case msg.GetOutput() != nil:
			if o.OnOutput != nil {
				o.OnOutput(OutputEntry(msg.GetOutput().GetEntryJson()))
			}
		case msg.GetToolCallCancelled() != nil:
			id := msg.GetToolCallCancelled().GetNestedCallId()
			if o.OnToolCallCancelled != nil {
				o.OnToolCallCancelled(id)
			}
			c.mu.Lock()
			for _, r := range c.runs {
				if cancel, ok := r.inFlight[id]; ok {
					cancel()
					delete(r.inFlight, id)
					break
				}
			}
			c.mu.Unlock()
		case msg.GetResult() != nil:
			result := resultOf(msg.GetResult())
			c.endLeg(run, l, result, waitRunID != "" && refusedBeforeTheRun(result))
			// Read the stream to its end (the service's status follows the Result), so that
			// the service finishes the RPC itself, then release it.
			go func() {
				defer l.release()
				for {
					if _, err := l.recv(); err != nil {
						return
					}
				}
			}()
			return result, nil
		}
	}
}

// attach adds a leg to its run's open legs; the run's kept results go out on it if it is the only one.
func (c *Client) attach(runID string, l *leg) *runCalls {
	c.mu.Lock()
	defer c.mu.Unlock()
	run := c.runs[runID]
	if run == nil {
		run = &runCalls{id: runID, inFlight: map[string]context.CancelFunc{}}
		c.runs[runID] = run
	}
	for _, open := range run.legs {
		if open == l {
			return run
		}
	}
	run.legs = append(run.legs, l)
	if len(run.legs) == 1 {
		c.flushLocked(run)
	}
	return run
}

// detachLocked removes an ended leg from its run: what it carried is kept for the run's next
// leg (it may have missed the run), and goes out at once on the run's next open leg, if any.
// It returns how many legs of the run are still open. c.mu is held.
func (c *Client) detachLocked(run *runCalls, l *leg) int {
	for i, open := range run.legs {
		if open == l {
			run.legs = append(run.legs[:i:i], run.legs[i+1:]...)
			run.undelivered = append(append([]*pb.ToolResult{}, l.sent...), run.undelivered...)
			l.sent = nil
			if len(run.legs) > 0 {
				c.flushLocked(run)
			}
			break
		}
	}
	return len(run.legs)
}

// flushLocked sends the run's kept results on its first open leg. c.mu is held.
func (c *Client) flushLocked(run *runCalls) {
	backlog := run.undelivered
	run.undelivered = nil
	for _, r := range backlog {
		c.deliverLocked(run, r)
	}
}

// refusedBeforeTheRun tells whether a wait's result refuses the wait itself, not an end of
// its run: the service answers a wait it cannot serve (bad input, an unknown run, another
// scope's run, a run another wait resumes) with invalid_input in the input phase, before any
// cell work (SPEC §5.2: such a refusal changes nothing).
func refusedBeforeTheRun(result *RunResult) bool {
	if result.Status != "failed" || result.Code != "invalid_input" {
		return false
	}
	var body struct {
		FailurePhase string `json:"failurePhase"`
	}
	return json.Unmarshal(result.Body, &body) == nil && body.FailurePhase == "input"
}

// endLeg ends a leg on its Result: keeps, or cancels and drops, its run's handlers. A wait
// the service refused before it touched the run (refusedWait) keeps them, and what its leg
// carried goes out on the next wait.
func (c *Client) endLeg(run *runCalls, l *leg, result *RunResult, refusedWait bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if run == nil {
		run = c.runs[result.RunID]
	}
	if run == nil {
		return
	}
	if result.Status == "waiting" || refusedWait {
		// Results written just before the service parked (or to a refused wait) may have missed the run.
		if c.detachLocked(run, l) == 0 && len(run.inFlight) == 0 && len(run.undelivered) == 0 {
			delete(c.runs, run.id)
		}
		return
	}
	run.abandonAll()
	delete(c.runs, run.id)
}

// failLeg ends a leg whose stream failed. While another leg of its run is open (a second wait
// refused with a status, e.g. RESOURCE_EXHAUSTED) the run stays that leg's; else the run ends here.
func (c *Client) failLeg(run *runCalls, l *leg) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.detachLocked(run, l) == 0 {
		run.abandonAll()
		delete(c.runs, run.id)
	}
}

// deliverLocked sends a result on the run's open leg, else keeps it for the next one. c.mu is held.
func (c *Client) deliverLocked(run *runCalls, result *pb.ToolResult) {
	if len(run.legs) > 0 {
		l := run.legs[0]
		if l.push(func() error { return l.sendResult(result) }) {
			l.sent = append(l.sent, result)
			return
		}
	}
	if c.runs[run.id] == run {
		run.undelivered = append(run.undelivered, result)
	}
}

var methods = map[pb.NestedCallMethod]string{
	pb.NestedCallMethod_NESTED_CALL_METHOD_CALL: "call", pb.NestedCallMethod_NESTED_CALL_METHOD_CALL_VALUE: "callValue",
	pb.NestedCallMethod_NESTED_CALL_METHOD_NAMESPACE: "namespace",
}

func (c *Client) dispatch(run *runCalls, tc *pb.ToolCall, handlers Handlers) {
	c.mu.Lock()
	if _, dup := run.inFlight[tc.GetNestedCallId()]; dup {
		c.mu.Unlock()
		return
	}
	// Handlers outlive the leg that dispatched them (late results); they end with the run.
	hctx, cancel := context.WithCancel(context.Background())
	run.inFlight[tc.GetNestedCallId()] = cancel
	c.mu.Unlock()
	source := strings.ToLower(strings.TrimPrefix(tc.GetSource().String(), "TOOL_SOURCE_"))
	info := ToolCallInfo{
		NestedCallID: tc.GetNestedCallId(), ParentToolCallID: tc.GetParentToolCallId(), RunID: tc.GetRunId(),
		ReplayID: tc.GetReplayId(), CatalogID: tc.GetCatalogId(), Source: source, Owner: tc.GetOwner(),
		Name: tc.GetName(), Method: methods[tc.GetMethod()],
	}
	handler := handlers[tc.GetCatalogId()]
	if handler == nil {
		handler = handlers[tc.GetName()]
	}
	go func() {
		result := invoke(hctx, handler, tc.GetInputJson(), info)
		c.mu.Lock()
		defer c.mu.Unlock()
		if _, live := run.inFlight[info.NestedCallID]; !live {
			return // abandoned
		}
		delete(run.inFlight, info.NestedCallID)
		cancel()
		c.deliverLocked(run, result)
	}()
}

func invoke(ctx context.Context, handler Handler, inputJSON string, info ToolCallInfo) (result *pb.ToolResult) {
	if handler == nil {
		return errorResult(info.NestedCallID, "failed", "no handler registered for "+info.CatalogID)
	}
	defer func() {
		if p := recover(); p != nil {
			result = errorResult(info.NestedCallID, "failed", fmt.Sprint(p))
		}
	}()
	if inputJSON == "" {
		inputJSON = "{}"
	}
	value, err := handler(ctx, json.RawMessage(inputJSON), info)
	var refusal *ToolRefusal
	switch {
	case errors.As(err, &refusal):
		if _, ok := kinds[refusal.Kind]; !ok {
			return errorResult(info.NestedCallID, "failed", refusal.Message)
		}
		return errorResult(info.NestedCallID, refusal.Kind, refusal.Message)
	case err != nil:
		return errorResult(info.NestedCallID, "failed", err.Error())
	}
	text, err := marshal(value)
	if err != nil {
		return errorResult(info.NestedCallID, "failed", "the tool result is not JSON-serialisable: "+err.Error())
	}
	if len(text)+toolResultEnvelopeBytes > MaxMessageBytes {
		// gRPC would end the whole stream for an oversized message; the guest gets B12 instead.
		return &pb.ToolResult{NestedCallId: info.NestedCallID, Outcome: &pb.ToolResult_OversizedBytes{OversizedBytes: int64(len(text))}}
	}
	return &pb.ToolResult{NestedCallId: info.NestedCallID, Outcome: &pb.ToolResult_OkJson{OkJson: text}}
}

// MaxMessageBytes is the service's gRPC message cap (SPEC §2.3, §3.5 item 5); a larger
// tool result is sent as oversized_bytes.
const MaxMessageBytes = 64 * 1024 * 1024

// toolResultEnvelopeBytes is room kept for the ToolResult's own fields (nested call id, framing).
const toolResultEnvelopeBytes = 4096

func errorResult(id, kind, message string) *pb.ToolResult {
	return &pb.ToolResult{NestedCallId: id, Outcome: &pb.ToolResult_Error{Error: &pb.ToolError{Kind: kinds[kind], Message: message}}}
}

// marshal is compact JSON without HTML escaping, as the other clients send it.
func marshal(v any) (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(buf.String(), "\n"), nil
}

func jsonText(v any) string {
	text, err := marshal(v)
	if err != nil {
		panic(err) // only called with string maps
	}
	return text
}

func compact(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return string(raw)
	}
	return buf.String()
}
