//go:build !lite

package policy

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/cagebox/cagebox/internal/hostname"
	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/checker"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/interpreter"
)

// conditionCostLimit bounds a condition's estimated worst-case cost (CEL's
// cost units), checked once when the policy is compiled, so evaluation
// needs no run-time cost tracking (which doubles its cost): with every
// string, list and map assumed up to celSizeHint long, nested loops over
// headers or the query are refused, while comparisons, lookups and single
// passes are accepted. (CEL has no unbounded loops; at run time the cost
// is linear in the request's own size, which the proxy bounds.)
const (
	conditionCostLimit = 1000000
	celSizeHint        = 1000
)

// sizeHints tells CEL's cost estimator how large request values may be.
type sizeHints struct{}

func (sizeHints) EstimateSize(checker.AstNode) *checker.SizeEstimate {
	return &checker.SizeEstimate{Min: 0, Max: celSizeHint}
}

func (sizeHints) EstimateCallCost(string, string, *checker.AstNode, []checker.AstNode) *checker.CallEstimate {
	return nil
}

// celEnv is the environment conditions are compiled in:
//
//	request.method, request.host, request.path, request.protocol: string
//	request.port, request.size: int (size -1 when unknown)
//	request.query, request.headers: map(string, string) (header names in
//	  lower case; repeated values joined with ", ")
//	request.time: timestamp
//	session.requests: int; session.fired: map(string, int);
//	session.spend: double; session.bytes_up, session.bytes_down: int
var celEnv = func() *cel.Env {
	env, err := cel.NewEnv(
		cel.Variable("request", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("session", cel.MapType(cel.StringType, cel.DynType)),
	)
	if err != nil {
		panic("policy: CEL environment: " + err.Error())
	}
	return env
}()

// condition is a compiled CEL condition; safe for concurrent use.
type condition struct {
	src string
	prg cel.Program
	// rules are the document's rule names: session.fired has a key (0
	// until it fires) for each, so a condition may index it freely.
	rules []string
}

func compileCondition(src string) (*condition, error) {
	if len(src) > MaxWhenLen {
		return nil, fmt.Errorf("the condition is %d bytes; the limit is %d", len(src), MaxWhenLen)
	}
	ast, iss := celEnv.Compile(src)
	if iss != nil && iss.Err() != nil {
		return nil, fmt.Errorf("the condition does not compile: %s", strings.ReplaceAll(iss.Err().Error(), "\n", " "))
	}
	if !ast.OutputType().IsExactType(types.BoolType) && !ast.OutputType().IsExactType(types.DynType) {
		return nil, fmt.Errorf("the condition is of type %s; it must be a bool (e.g. request.method == \"POST\")", ast.OutputType())
	}
	est, err := celEnv.EstimateCost(ast, sizeHints{})
	if err != nil {
		return nil, fmt.Errorf("the condition's cost cannot be estimated: %v", err)
	}
	if est.Max > conditionCostLimit {
		return nil, fmt.Errorf("the condition may cost up to %d units to evaluate; the limit is %d (avoid loops within loops over headers or the query)", est.Max, conditionCostLimit)
	}
	prg, err := celEnv.Program(ast, cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		return nil, fmt.Errorf("the condition cannot run: %v", err)
	}
	return &condition{src: src, prg: prg}, nil
}

// activation is what conditions read, built once per decision (lazily:
// only when a rule with a condition matches) and shared by its rules.
type activation struct {
	r    *Request
	vars interpreter.Activation
}

// get returns the activation, its values converted to CEL values once
// (not on every access of every condition).
func (a *activation) get(rules []string) interpreter.Activation {
	if a.vars == nil {
		ss := a.r.Session
		if ss == nil && a.r.SessionFunc != nil {
			ss = a.r.SessionFunc()
		}
		vars := map[string]any{"request": toCEL(requestMap(a.r)), "session": toCEL(sessionMap(ss, rules))}
		a.vars, _ = interpreter.NewActivation(vars)
	}
	return a.vars
}

// toCEL converts a map of native values to a CEL map whose values are
// already CEL values.
func toCEL(m map[string]any) ref.Val {
	out := make(map[string]ref.Val, len(m))
	for k, v := range m {
		out[k] = types.DefaultTypeAdapter.NativeToValue(v)
	}
	return types.NewStringInterfaceMap(types.DefaultTypeAdapter, refMap(out))
}

func refMap(m map[string]ref.Val) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// evalIn runs the condition on a's variables. A result that is not a bool
// is an error.
func (c *condition) evalIn(a *activation) (bool, error) {
	out, _, err := c.prg.Eval(a.get(c.rules))
	if err != nil {
		return false, err
	}
	b, ok := out.Value().(bool)
	if !ok {
		return false, errors.New("the condition did not give a bool")
	}
	return b, nil
}

func requestMap(r *Request) map[string]any {
	q := map[string]string{}
	query := r.Query
	if query == nil && r.RawQuery != "" {
		query, _ = url.ParseQuery(r.RawQuery)
	}
	for k, vs := range query {
		if len(vs) > 0 {
			q[k] = vs[0]
		}
	}
	h := make(map[string]string, len(r.Header))
	for k, vs := range r.Header {
		h[strings.ToLower(k)] = strings.Join(vs, ", ")
	}
	method := r.Method
	if method == "" {
		method = "GET"
	}
	path := r.Path
	if path == "" {
		path = "/"
	}
	proto := r.Protocol
	if proto == "" {
		proto = ProtocolHTTP
	}
	t := r.Time
	if t.IsZero() {
		t = time.Now()
	}
	size := r.BodySize
	return map[string]any{
		"method": asciiUpper(method), "host": hostname.Lower(strings.TrimSuffix(r.Host, ".")), "port": int64(r.Port),
		"path": path, "protocol": proto, "query": q, "headers": h, "size": size, "time": t,
	}
}

func sessionMap(s *Session, rules []string) map[string]any {
	if s == nil {
		s = &Session{}
	}
	fired := make(map[string]int64, len(rules))
	for _, k := range rules {
		fired[k] = 0
	}
	for k, v := range s.Fired {
		fired[k] = v
	}
	return map[string]any{
		"requests": s.Requests, "fired": fired, "spend": s.Spend,
		"bytes_up": s.BytesUp, "bytes_down": s.BytesDown,
	}
}
