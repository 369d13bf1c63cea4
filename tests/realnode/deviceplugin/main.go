// A legacy GPU device plugin for the real-node tier: it offers a resource (nvidia.com/gpu) made of
// the device IDs it is given (cards' UUIDs, as NVIDIA's device plugin names them) to the kubelet's
// device manager through the kubelet's own device plugin API (k8s.io/kubelet deviceplugin
// v1beta1), so that legacy pods get cards from the real device manager while the gateway's node
// plugin reads the real pod-resources API beside it.
//
//	deviceplugin -resource nvidia.com/gpu -devices GPU-a,GPU-b [-dir /var/lib/kubelet/device-plugins/]
//	             [-unhealthy-file FILE]
//
// FILE lists the IDs to report Unhealthy, one per line (NVIDIA's plugin does so after an XID); it
// is read every 200 ms and a change is streamed to the kubelet at once. The plugin registers again
// whenever its socket disappears (the kubelet removes every socket of the folder when it starts).
// SIGTERM stops it and removes its socket, as a departing plugin pod does. It prints one line per
// event ("registered", "listed ...", "allocated ...") on standard output.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	api.UnimplementedDevicePluginServer

	ids []string

	mu        sync.Mutex
	unhealthy map[string]bool
	changed   chan struct{} // closed and replaced on every health change
}

func (p *plugin) devices() ([]*api.Device, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*api.Device, 0, len(p.ids))
	for _, id := range p.ids {
		health := api.Healthy
		if p.unhealthy[id] {
			health = api.Unhealthy
		}
		out = append(out, &api.Device{ID: id, Health: health})
	}
	return out, p.changed
}

func (p *plugin) setUnhealthy(ids map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(ids) == len(p.unhealthy) {
		same := true
		for id := range ids {
			if !p.unhealthy[id] {
				same = false
			}
		}
		if same {
			return
		}
	}
	p.unhealthy = ids
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *plugin) GetDevicePluginOptions(context.Context, *api.Empty) (*api.DevicePluginOptions, error) {
	return &api.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *api.Empty, stream grpc.ServerStreamingServer[api.ListAndWatchResponse]) error {
	for {
		devices, changed := p.devices()
		if err := stream.Send(&api.ListAndWatchResponse{Devices: devices}); err != nil {
			return err
		}
		states := make([]string, 0, len(devices))
		for _, d := range devices {
			states = append(states, d.ID+"="+d.Health)
		}
		fmt.Printf("listed %s\n", strings.Join(states, ","))
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

func (p *plugin) Allocate(_ context.Context, req *api.AllocateRequest) (*api.AllocateResponse, error) {
	out := &api.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		ids := slices.Clone(c.DevicesIds)
		slices.Sort(ids)
		fmt.Printf("allocated %s\n", strings.Join(ids, ","))
		out.ContainerResponses = append(out.ContainerResponses, &api.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(ids, ",")},
		})
	}
	return out, nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *api.PreferredAllocationRequest) (*api.PreferredAllocationResponse, error) {
	return &api.PreferredAllocationResponse{}, nil
}

func (p *plugin) PreStartContainer(context.Context, *api.PreStartContainerRequest) (*api.PreStartContainerResponse, error) {
	return &api.PreStartContainerResponse{}, nil
}

func readUnhealthy(path string) map[string]bool {
	out := map[string]bool{}
	if path == "" {
		return out
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(data), "\n") {
		if id := strings.TrimSpace(line); id != "" {
			out[id] = true
		}
	}
	return out
}

// serve listens on socket and registers with the kubelet; the server stops when ctx ends.
func serve(ctx context.Context, p *plugin, dir, socket, resource string) (*grpc.Server, error) {
	path := filepath.Join(dir, socket)
	_ = os.Remove(path)
	listener, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	server := grpc.NewServer()
	api.RegisterDevicePluginServer(server, p)
	go func() { _ = server.Serve(listener) }()

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		server.Stop()
		return nil, err
	}
	defer conn.Close()
	callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = api.NewRegistrationClient(conn).Register(callCtx, &api.RegisterRequest{
		Version: api.Version, Endpoint: socket, ResourceName: resource,
		Options: &api.DevicePluginOptions{},
	})
	if err != nil {
		server.Stop()
		return nil, fmt.Errorf("registering with the kubelet: %w", err)
	}
	fmt.Println("registered")
	return server, nil
}

func main() {
	dir := flag.String("dir", api.DevicePluginPath, "the kubelet's device plugin folder")
	resource := flag.String("resource", "nvidia.com/gpu", "the extended resource offered")
	devices := flag.String("devices", "", "comma-separated device IDs")
	unhealthyFile := flag.String("unhealthy-file", "", "file listing the IDs to report Unhealthy")
	socket := flag.String("socket", "dra-gateway-test-gpu.sock", "this plugin's socket name")
	flag.Parse()
	if *devices == "" {
		fmt.Fprintln(os.Stderr, "deviceplugin: -devices is required")
		os.Exit(2)
	}
	p := &plugin{ids: strings.Split(*devices, ","), unhealthy: map[string]bool{},
		changed: make(chan struct{})}
	p.setUnhealthy(readUnhealthy(*unhealthyFile))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	path := filepath.Join(*dir, *socket)
	var server *grpc.Server
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(path); server == nil || err != nil {
			if server != nil {
				server.Stop()
				fmt.Println("socket removed: registering again")
			}
			var err error
			if server, err = serve(ctx, p, *dir, *socket, *resource); err != nil {
				fmt.Fprintf(os.Stderr, "deviceplugin: %v\n", err)
				server = nil
			}
		}
		p.setUnhealthy(readUnhealthy(*unhealthyFile))
		select {
		case <-ctx.Done():
			if server != nil {
				server.Stop()
			}
			_ = os.Remove(path)
			fmt.Println("stopped")
			return
		case <-tick.C:
		}
	}
}
