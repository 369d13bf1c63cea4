// Command podresources plays the kubelet's pod-resources API (v1.PodResourcesLister) on a unix
// socket, built from the kubelet's own generated package (k8s.io/kubelet/pkg/apis/podresources/v1,
// version in go.mod) and grpc-go, so that a test proves the node plugin's client is wire
// compatible with the real definitions and not only with our hand-written .proto file.
//
// Usage:
//
//	podresources -socket SOCKET -state FILE
//	podresources -describe
//
// It answers List and GetAllocatableResources from FILE, re-read on every call, so that a test
// changes what legacy pods hold, or what a legacy device plugin offers, by rewriting the file
// (write a new file and rename it over the old one: a half-written file is an error answer).
// FILE is a JSON object {"allocatable": AllocatableResourcesResponse, "list":
// ListPodResourcesResponse}, both as protojson (proto or JSON field names); a missing key is an
// empty answer. A FILE that cannot be read or parsed is answered with codes.Unavailable and the
// reason, as a kubelet that cannot answer would. Get is left unimplemented, as on a kubelet
// without the KubeletPodResourcesGet gate.
//
// Once listening it prints "serving SOCKET" on stdout; SIGTERM or SIGINT stops it and removes
// the socket. -describe prints the upstream FileDescriptorProto as protojson (proto field names)
// for a test to compare field by field with our .proto file. Bad usage exits 2.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protodesc"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

type server struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	state string
}

// read parses the state file into the two answers; every call reads it afresh.
func (s *server) read() (*podresourcesapi.AllocatableResourcesResponse, *podresourcesapi.ListPodResourcesResponse, error) {
	raw, err := os.ReadFile(s.state)
	if err != nil {
		return nil, nil, status.Errorf(codes.Unavailable, "reading the state file: %v", err)
	}
	var parts map[string]json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, nil, status.Errorf(codes.Unavailable, "state file %s: %v", s.state, err)
	}
	for key := range parts {
		if key != "allocatable" && key != "list" {
			return nil, nil, status.Errorf(codes.Unavailable,
				"state file %s: unknown key %q (want allocatable, list)", s.state, key)
		}
	}
	allocatable := &podresourcesapi.AllocatableResourcesResponse{}
	list := &podresourcesapi.ListPodResourcesResponse{}
	if b, ok := parts["allocatable"]; ok {
		if err := protojson.Unmarshal(b, allocatable); err != nil {
			return nil, nil, status.Errorf(codes.Unavailable, "state file %s: allocatable: %v", s.state, err)
		}
	}
	if b, ok := parts["list"]; ok {
		if err := protojson.Unmarshal(b, list); err != nil {
			return nil, nil, status.Errorf(codes.Unavailable, "state file %s: list: %v", s.state, err)
		}
	}
	return allocatable, list, nil
}

func (s *server) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	_, list, err := s.read()
	return list, err
}

func (s *server) GetAllocatableResources(context.Context, *podresourcesapi.AllocatableResourcesRequest) (*podresourcesapi.AllocatableResourcesResponse, error) {
	allocatable, _, err := s.read()
	return allocatable, err
}

func describe() error {
	file := protodesc.ToFileDescriptorProto((&podresourcesapi.ListPodResourcesRequest{}).ProtoReflect().Descriptor().ParentFile())
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(file)
	if err != nil {
		return err
	}
	_, err = fmt.Println(string(b))
	return err
}

type usageError struct{ error }

func run() error {
	socket := flag.String("socket", "", "unix socket to serve on (replaced if it exists)")
	state := flag.String("state", "", "JSON file with the answers, re-read on every call")
	describeOnly := flag.Bool("describe", false, "print the upstream descriptor and exit")
	flag.Parse()
	if *describeOnly {
		return describe()
	}
	if *socket == "" || *state == "" {
		return usageError{errors.New("-socket and -state are required")}
	}
	if err := os.Remove(*socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	listener, err := net.Listen("unix", *socket)
	if err != nil {
		return err
	}
	grpcServer := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(grpcServer, &server{state: *state})
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		grpcServer.Stop()
	}()
	fmt.Printf("serving %s\n", *socket)
	err = grpcServer.Serve(listener)
	_ = os.Remove(*socket)
	return err
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		var usage usageError
		if errors.As(err, &usage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}
