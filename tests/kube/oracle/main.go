// Command oracle answers questions about Kubernetes quantities and DRA CEL selectors with the
// upstream Go implementations, so that tests/kube/test_oracle.py can compare the project's
// Python implementation against them. It is a test tool, not part of the product.
//
// Protocol: one JSON object per line on stdin, one JSON object per line on stdout, in order.
//
//	{"op":"quantity","s":"1.5Gi"}
//	  -> {"error":"..."} or {"string":"1536Mi","format":"BinarySI","value":1610612736,"milli":...}
//	{"op":"pair","a":"1Gi","b":"512Mi"}
//	  -> {"cmp":1,"add":"1536Mi","sub":"512Mi"} (or {"error":...} if either does not parse)
//	{"op":"cel","expr":"...","device":{"driver":"d","attributes":{"n":{"string":"x"}},
//	      "capacity":{"memory":"80Gi"},"allowMultipleAllocations":true}}
//	  -> {"compile_error":"..."} or {"error":"..."} or {"result":true}
//	     plus "new_compile_error" when the API server's stricter environment for new
//	     expressions refuses what the scheduler's environment compiles.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apiserver/pkg/cel/environment"
	dracel "k8s.io/dynamic-resource-allocation/cel"
)

type attribute struct {
	Int     *int64  `json:"int,omitempty"`
	Bool    *bool   `json:"bool,omitempty"`
	String  *string `json:"string,omitempty"`
	Version *string `json:"version,omitempty"`
}

type device struct {
	Driver                   string               `json:"driver"`
	Attributes               map[string]attribute `json:"attributes"`
	Capacity                 map[string]string    `json:"capacity"`
	AllowMultipleAllocations *bool                `json:"allowMultipleAllocations"`
}

type request struct {
	Op     string  `json:"op"`
	S      string  `json:"s"`
	A      string  `json:"a"`
	B      string  `json:"b"`
	Expr   string  `json:"expr"`
	Device *device `json:"device"`
}

func quantity(s string) map[string]any {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return map[string]any{"error": err.Error()}
	}
	return map[string]any{
		"string": q.String(),
		"format": string(q.Format),
		"value":  q.Value(),
		"milli":  q.MilliValue(),
	}
}

func pair(a, b string) map[string]any {
	x, err := resource.ParseQuantity(a)
	if err != nil {
		return map[string]any{"error": err.Error()}
	}
	y, err := resource.ParseQuantity(b)
	if err != nil {
		return map[string]any{"error": err.Error()}
	}
	sum := x.DeepCopy()
	sum.Add(y)
	diff := x.DeepCopy()
	diff.Sub(y)
	return map[string]any{"cmp": x.Cmp(y), "add": sum.String(), "sub": diff.String()}
}

func celDevice(d *device) (dracel.Device, error) {
	out := dracel.Device{
		Driver:                   d.Driver,
		AllowMultipleAllocations: d.AllowMultipleAllocations,
		Attributes:               map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{},
		Capacity:                 map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{},
	}
	for name, a := range d.Attributes {
		out.Attributes[resourceapi.QualifiedName(name)] = resourceapi.DeviceAttribute{
			IntValue: a.Int, BoolValue: a.Bool, StringValue: a.String, VersionValue: a.Version,
		}
	}
	for name, text := range d.Capacity {
		q, err := resource.ParseQuantity(text)
		if err != nil {
			return out, fmt.Errorf("capacity %s: %w", name, err)
		}
		out.Capacity[resourceapi.QualifiedName(name)] = resourceapi.DeviceCapacity{Value: q}
	}
	return out, nil
}

func evaluate(expr string, d *device) map[string]any {
	compiler := dracel.GetCompiler(dracel.Features{EnableConsumableCapacity: true})
	out := map[string]any{}
	newEnv := environment.NewExpressions
	if strict := compiler.CompileCELExpression(expr, dracel.Options{EnvType: &newEnv}); strict.Error != nil {
		out["new_compile_error"] = strict.Error.Error()
	}
	compiled := compiler.CompileCELExpression(expr, dracel.Options{})
	if compiled.Error != nil {
		out["compile_error"] = compiled.Error.Error()
		return out
	}
	if d == nil {
		return out
	}
	input, err := celDevice(d)
	if err != nil {
		out["error"] = "bad device: " + err.Error()
		return out
	}
	matches, _, err := compiled.DeviceMatches(context.Background(), input)
	if err != nil {
		out["error"] = err.Error()
		return out
	}
	out["result"] = matches
	return out
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	for in.Scan() {
		var req request
		var answer map[string]any
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			answer = map[string]any{"protocol_error": err.Error()}
		} else {
			switch req.Op {
			case "quantity":
				answer = quantity(req.S)
			case "pair":
				answer = pair(req.A, req.B)
			case "cel":
				answer = evaluate(req.Expr, req.Device)
			default:
				answer = map[string]any{"protocol_error": "unknown op " + req.Op}
			}
		}
		if err := enc.Encode(answer); err != nil {
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
