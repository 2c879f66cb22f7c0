package cellblock

import (
	"context"
	"net"
	"runtime"
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
	listener := bufconn.Listen(1 << 20)
	server := grpc.NewServer()
	pb.RegisterCodeModeServiceServer(server, resultServer{})
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
