package daemon

import (
	"encoding/json"
	"sort"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/api"
)

// TestOpenAPIMatchesRoutes keeps api/openapi.json in step with the handlers.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	inDoc := map[string]bool{}
	for path, ops := range doc.Paths {
		for method := range ops {
			inDoc[strings.ToUpper(method)+" "+path] = true
		}
	}
	inCode := map[string]bool{}
	for _, r := range Routes() {
		inCode[r.Method+" "+r.Path] = true
	}
	var missing, extra []string
	for k := range inCode {
		if !inDoc[k] {
			missing = append(missing, k)
		}
	}
	for k := range inDoc {
		if !inCode[k] {
			extra = append(extra, k)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 {
		t.Errorf("routes missing from api/openapi.json: %v", missing)
	}
	if len(extra) > 0 {
		t.Errorf("api/openapi.json documents routes that do not exist: %v", extra)
	}
}
