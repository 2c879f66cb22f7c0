package cellblock

import (
	"context"
	"encoding/json"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	pb "cellblock/clients/go/gen/cellblockv1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"
)

// resultServer answers every Exec and Wait with a completed Result, as the service does.
type resultServer struct {
	pb.UnimplementedCodeModeServiceServer
}

func (resultServer) Exec(stream pb.CodeModeService_ExecServer) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	return stream.Send(&pb.ExecResponse{Message: &pb.ExecResponse_Result{Result: &pb.Result{
		Status: pb.RunStatus_RUN_STATUS_COMPLETED, ResultJson: `{"status":"completed","value":1}`,
	}}})
}

func (resultServer) Wait(stream pb.CodeModeService_WaitServer) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	return stream.Send(&pb.WaitResponse{Message: &pb.WaitResponse_Result{Result: &pb.Result{
		Status: pb.RunStatus_RUN_STATUS_COMPLETED, ResultJson: `{"status":"completed","value":2}`,
	}}})
}

func dialFake(t *testing.T) *Client {
	t.Helper()
	return dialServer(t, resultServer{})
}

func dialServer(t *testing.T, fake pb.CodeModeServiceServer) *Client {
	t.Helper()
	listener := bufconn.Listen(1 << 20)
	server := grpc.NewServer()
	pb.RegisterCodeModeServiceServer(server, fake)
	go func() { _ = server.Serve(listener) }()
	t.Cleanup(server.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, "passthrough:///fake", grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) {
		return listener.Dial()
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A leg that returned its Result releases its stream even when the caller's context lives on
// (context.Background()): grpc-go keeps a goroutine per stream until it is read to its end or
// its context is cancelled.
func TestFinishedLegsReleaseTheirStreams(t *testing.T) {
	c := dialFake(t)
	scope := Scope{SessionID: "s", AgentRunID: "r"}
	ctx := context.Background()
	if _, err := c.Exec(ctx, scope, ExecOptions{ToolCallID: "warm", Code: "return 1;"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	before := runtime.NumGoroutine()
	const legs = 40
	for i := 0; i < legs; i++ {
		if _, err := c.Exec(ctx, scope, ExecOptions{ToolCallID: "c", Code: "return 1;"}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Wait(ctx, scope, WaitOptions{ToolCallID: "w", RunID: "run_x"}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	after := runtime.NumGoroutine()
	for after > before+5 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		after = runtime.NumGoroutine()
	}
	if after > before+5 {
		t.Fatalf("%d legs left %d goroutines behind (%d before, %d after)", 2*legs, after-before, before, after)
	}
}

const w06 = "this run is already being resumed by another wait; let that call return first."

// raceServer serves two concurrent waits on one run as the service may: the later one (tool
// call id "later") resumes the run and sends a ToolCall; the earlier one is refused with [W06]
// once the client has had the chance to write the call's result on it.
type raceServer struct {
	pb.UnimplementedCodeModeServiceServer
	called   chan struct{}       // closed once the later wait sent its ToolCall
	answered chan *pb.ToolResult // what the later wait received
}

// nextToolResult is the stream's next ToolResult, or nil when none comes within d.
func nextToolResult(stream pb.CodeModeService_WaitServer, d time.Duration) *pb.ToolResult {
	got := make(chan *pb.ToolResult, 1)
	go func() {
		req, err := stream.Recv()
		if err != nil {
			got <- nil
			return
		}
		got <- req.GetToolResult()
	}()
	select {
	case r := <-got:
		return r
	case <-time.After(d):
		return nil
	}
}

func (s raceServer) Wait(stream pb.CodeModeService_WaitServer) error {
	start, err := stream.Recv()
	if err != nil {
		return err
	}
	runID := "run_" + strings.Repeat("1", 32)
	if start.GetStart().GetToolCallId() != "later" {
		<-s.called
		nextToolResult(stream, time.Second)
		return stream.Send(&pb.WaitResponse{Message: &pb.WaitResponse_Result{Result: &pb.Result{
			Status: pb.RunStatus_RUN_STATUS_FAILED, Code: pb.ErrorCode_ERROR_CODE_INVALID_INPUT,
			ResultJson: `{"status":"failed","error":"` + w06 + `","code":"invalid_input","failurePhase":"input"}`,
		}}})
	}
	if err := stream.Send(&pb.WaitResponse{Message: &pb.WaitResponse_ToolCall{ToolCall: &pb.ToolCall{
		NestedCallId: "cellblock_c1_00000000_2", RunId: runID, CatalogId: "client:app:lookup", Source: pb.ToolSource_TOOL_SOURCE_CLIENT, Owner: "app", Name: "lookup", InputJson: "{}",
	}}}); err != nil {
		return err
	}
	close(s.called)
	answer := nextToolResult(stream, 5*time.Second)
	s.answered <- answer
	status := pb.RunStatus_RUN_STATUS_WAITING
	if answer != nil {
		status = pb.RunStatus_RUN_STATUS_COMPLETED
	}
	return stream.Send(&pb.WaitResponse{Message: &pb.WaitResponse_Result{Result: &pb.Result{Status: status, RunId: runID, ResultJson: "{}"}}})
}

// Two waits on one run race, and the service lets the later one resume the run and refuses the
// earlier one ([W06], SPEC §5.2 item 5) after the client wrote the run's result on it: the
// refusal must hand that result, and the run, to the wait still open.
func TestARefusedEarlierWaitHandsTheRunToTheLaterWait(t *testing.T) {
	fake := raceServer{called: make(chan struct{}), answered: make(chan *pb.ToolResult, 1)}
	c := dialServer(t, fake)
	scope := Scope{SessionID: "s", AgentRunID: "r"}
	runID := "run_" + strings.Repeat("1", 32)
	handlers := Handlers{"lookup": func(context.Context, json.RawMessage, ToolCallInfo) (any, error) {
		return map[string]any{"details": map[string]bool{"found": true}}, nil
	}}
	type outcome struct {
		r   *RunResult
		err error
	}
	earlier := make(chan outcome, 1)
	go func() {
		r, err := c.Wait(context.Background(), scope, WaitOptions{LegOptions: LegOptions{Handlers: handlers}, ToolCallID: "earlier", RunID: runID})
		earlier <- outcome{r, err}
	}()
	// The earlier wait attaches first: the later one starts once the service holds the earlier stream.
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.mu.Lock()
		run := c.runs[runID]
		attached := run != nil && len(run.legs) == 1
		c.mu.Unlock()
		if attached || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	later, err := c.Wait(context.Background(), scope, WaitOptions{LegOptions: LegOptions{Handlers: handlers}, ToolCallID: "later", RunID: runID})
	if err != nil {
		t.Fatal(err)
	}
	refused := <-earlier
	if refused.err != nil {
		t.Fatal(refused.err)
	}
	if !strings.Contains(refused.r.ResultJSON, w06) {
		t.Fatalf("the earlier wait was not refused: %s", refused.r.ResultJSON)
	}
	if later.Status != "completed" {
		t.Fatalf("the resuming wait never got the run's result: %s %s", later.Status, later.ResultJSON)
	}
	if answer := <-fake.answered; answer.GetOkJson() != `{"details":{"found":true}}` {
		t.Fatalf("the resuming wait got %v", answer)
	}
}
