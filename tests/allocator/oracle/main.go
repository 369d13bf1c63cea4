// Command allocoracle answers whether a ResourceClaim can be allocated on one node, using the
// upstream structured allocator (k8s.io/dynamic-resource-allocation/structured), so that
// tests/allocator/test_planner_oracle.py can compare the planner's feasibility verdicts against
// it. It is a test tool, not part of the product.
//
// Protocol: one JSON object per line on stdin, one JSON object per line on stdout, in order.
//
//	{"node": Node, "slices": [ResourceSlice], "classes": [DeviceClass],
//	 "allocated": [ResourceClaim with status.allocation], "claim": ResourceClaim,
//	 "consumableCapacity": false}
//	  -> {"allocated": false}
//	     or {"allocated": true, "results": [{"request": "r", "driver": "d", "pool": "p",
//	         "device": "x"}]}
//	     or {"error": "..."} when the allocator refuses the input (e.g. a CEL runtime error)
//	     or {"panic": "..."} when the allocator panics
//
// Features are those of Kubernetes 1.34's defaults: prioritized list and admin access on,
// partitionable devices, device taints and device binding off; consumable capacity and
// partitionable devices only when the scenario asks for them.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/sets"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

type scenario struct {
	Node               *v1.Node                     `json:"node"`
	Slices             []*resourceapi.ResourceSlice `json:"slices"`
	Classes            []*resourceapi.DeviceClass   `json:"classes"`
	Allocated          []*resourceapi.ResourceClaim `json:"allocated"`
	Claim              *resourceapi.ResourceClaim   `json:"claim"`
	ConsumableCapacity bool                         `json:"consumableCapacity"`
	// Partitionable devices (DRAPartitionableDevices): counter sets and the devices drawing on them.
	PartitionableDevices bool `json:"partitionableDevices"`
}

type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(l))
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

type result struct {
	Request string `json:"request"`
	Driver  string `json:"driver"`
	Pool    string `json:"pool"`
	Device  string `json:"device"`
}

func allocatedState(claims []*resourceapi.ResourceClaim) structured.AllocatedState {
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID == nil {
				state.AllocatedDevices.Insert(id)
				continue
			}
			state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
	return state
}

var celCache = dracel.NewCache(1000, dracel.Features{})
var celCacheConsumable = dracel.NewCache(1000, dracel.Features{EnableConsumableCapacity: true})

func answer(line []byte) (reply map[string]any) {
	// The experimental allocator (consumable capacity) of v0.34 can index past a slice's
	// devices; such a scenario has no reference answer, and the caller is told so.
	defer func() {
		if r := recover(); r != nil {
			reply = map[string]any{"panic": fmt.Sprint(r)}
		}
	}()
	var s scenario
	if err := json.Unmarshal(line, &s); err != nil {
		return map[string]any{"protocol_error": err.Error()}
	}
	if s.Claim == nil || s.Node == nil {
		return map[string]any{"protocol_error": "scenario needs node and claim"}
	}
	features := structured.Features{
		AdminAccess:          true,
		PrioritizedList:      true,
		ConsumableCapacity:   s.ConsumableCapacity,
		PartitionableDevices: s.PartitionableDevices,
	}
	cache := celCache
	if s.ConsumableCapacity {
		cache = celCacheConsumable
	}
	classes := classLister{}
	for _, c := range s.Classes {
		classes[c.Name] = c
	}
	ctx := context.Background()
	allocator, err := structured.NewAllocator(ctx, features, allocatedState(s.Allocated), classes, s.Slices, cache)
	if err != nil {
		return map[string]any{"error": err.Error()}
	}
	results, err := allocator.Allocate(ctx, s.Node, []*resourceapi.ResourceClaim{s.Claim})
	if err != nil {
		return map[string]any{"error": err.Error()}
	}
	if results == nil {
		return map[string]any{"allocated": false}
	}
	out := []result{}
	for _, r := range results[0].Devices.Results {
		out = append(out, result{Request: r.Request, Driver: r.Driver, Pool: r.Pool, Device: r.Device})
	}
	return map[string]any{"allocated": true, "results": out}
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	for in.Scan() {
		if err := enc.Encode(answer(in.Bytes())); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := out.Flush(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
