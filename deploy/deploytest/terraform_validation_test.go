package deploytest

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/tryfunc"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
)

// validationFuncs are the Terraform functions variables.tf's validations
// call, as Terraform defines them (cidrhost for IPv4).
var validationFuncs = map[string]function.Function{
	"can":      tryfunc.CanFunc,
	"try":      tryfunc.TryFunc,
	"contains": stdlib.ContainsFunc,
	"split":    stdlib.SplitFunc,
	"alltrue": function.New(&function.Spec{
		Params: []function.Parameter{{Name: "list", Type: cty.List(cty.Bool)}},
		Type:   function.StaticReturnType(cty.Bool),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			for _, v := range args[0].AsValueSlice() {
				if v.False() {
					return cty.False, nil
				}
			}
			return cty.True, nil
		},
	}),
	"cidrhost": function.New(&function.Spec{
		Params: []function.Parameter{{Name: "prefix", Type: cty.String}, {Name: "hostnum", Type: cty.Number}},
		Type:   function.StaticReturnType(cty.String),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			p, err := netip.ParsePrefix(args[0].AsString())
			if err != nil || !p.Addr().Is4() {
				return cty.NilVal, fmt.Errorf("invalid IPv4 CIDR %q", args[0].AsString())
			}
			n, _ := args[1].AsBigFloat().Int64()
			if n < 0 || n >= 1<<(32-p.Bits()) {
				return cty.NilVal, fmt.Errorf("host number %d out of range", n)
			}
			a := p.Masked().Addr().As4()
			v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) + uint32(n)
			return cty.StringVal(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()), nil
		},
	}),
}

// validate evaluates every validation block of variable name in
// deploy/terraform/gcp/variables.tf for value, returning the error messages
// of the conditions that fail.
func validate(t *testing.T, name string, value cty.Value) []string {
	t.Helper()
	f, diags := hclparse.NewParser().ParseHCL(readRepoFile(t, "deploy/terraform/gcp/variables.tf"), "variables.tf")
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	ctx := &hcl.EvalContext{
		Variables: map[string]cty.Value{"var": cty.ObjectVal(map[string]cty.Value{name: value})},
		Functions: validationFuncs,
	}
	var failed []string
	found := 0
	for _, blk := range f.Body.(*hclsyntax.Body).Blocks {
		if blk.Type != "variable" || blk.Labels[0] != name {
			continue
		}
		for _, v := range blk.Body.Blocks {
			if v.Type != "validation" {
				continue
			}
			found++
			ok, diags := v.Body.Attributes["condition"].Expr.Value(ctx)
			if diags.HasErrors() {
				t.Fatalf("variable %s: a validation does not evaluate for %#v: %s", name, value, diags.Error())
			}
			if ok.False() {
				msg, _ := v.Body.Attributes["error_message"].Expr.Value(ctx)
				failed = append(failed, msg.AsString())
			}
		}
	}
	if found == 0 {
		t.Fatalf("variable %s has no validation", name)
	}
	return failed
}

func networks(cidrs ...string) cty.Value {
	if len(cidrs) == 0 {
		return cty.ListValEmpty(cty.Object(map[string]cty.Type{"cidr_block": cty.String, "display_name": cty.String}))
	}
	var l []cty.Value
	for _, c := range cidrs {
		l = append(l, cty.ObjectVal(map[string]cty.Value{"cidr_block": cty.StringVal(c), "display_name": cty.StringVal("x")}))
	}
	return cty.ListVal(l)
}

// TestTerraformAuthorizedNetworksRefuseDocumentationRanges: an example
// address copied as is (RFC 5737) would lock kubectl out of the cluster; the
// plan refuses it, and a real address, a broader range or an empty list pass.
func TestTerraformAuthorizedNetworksRefuseDocumentationRanges(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cidrs []string
		want  string // "" passes
	}{
		{nil, ""},
		{[]string{"198.18.7.4/32"}, ""},
		{[]string{"203.0.0.0/16"}, ""},
		{[]string{"35.190.10.0/24", "10.0.0.0/8"}, ""},
		{[]string{"203.0.113.0/24"}, "documentation ranges"},
		{[]string{"198.51.100.7/32"}, "documentation ranges"},
		{[]string{"35.190.10.0/24", "192.0.2.10/32"}, "documentation ranges"},
		{[]string{"my office"}, "must be an IPv4 CIDR"},
	} {
		failed := validate(t, "master_authorized_networks", networks(tc.cidrs...))
		got := strings.Join(failed, " | ")
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("master_authorized_networks %v: validation says %q, want %q", tc.cidrs, got, tc.want)
		}
	}
}
