package deploytest

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
	ctyjson "github.com/zclconf/go-cty/cty/json"
)

// A small evaluator of the Terraform module, enough for the checks of
// terraform_test.go without a terraform binary or cloud access: it parses
// every .tf file with hclparse, takes the variables' defaults overridden by
// terraform.tfvars.example, evaluates the locals and each resource's
// for_each, and evaluates every instance's arguments and nested blocks
// (dynamic blocks expanded). References to other resources resolve to the
// arguments evaluated for them plus the few computed attributes the module
// reads (tfComputed); anything else stays unknown, so a check on it fails
// rather than passes.

// Stand-ins for what only GCP knows.
const (
	tfTestProjectNumber = "123456789012"
	tfTestSQLPrivateIP  = "10.99.0.3"
)

type tfModule struct {
	dir        string
	files      map[string][]byte // .tf file name -> content
	bodies     map[string]*hclsyntax.Body
	vars       map[string]cty.Value
	locals     map[string]cty.Value
	localExprs map[string]hcl.Expression
	blocks     []*tfBlock
}

// tfBlock is a resource or data block.
type tfBlock struct {
	mode, typ, name string
	file            string
	body            *hclsyntax.Body
	forEach         *hclsyntax.Attribute // nil: a single instance, key ""
	instances       map[string]*tfBody   // nil until for_each is known
}

func (b *tfBlock) addr() string {
	if b.mode == "data" {
		return "data." + b.typ + "." + b.name
	}
	return b.typ + "." + b.name
}

// tfBody is an evaluated body: arguments (unknown when they did not
// evaluate) and nested blocks by type, dynamic ones expanded.
type tfBody struct {
	attrs  map[string]cty.Value
	blocks map[string][]*tfBody
}

// str returns a known string argument, "" otherwise.
func (b *tfBody) str(name string) string {
	v, ok := b.attrs[name]
	if !ok || !v.IsWhollyKnown() || v.IsNull() {
		return ""
	}
	s, err := convert.Convert(v, cty.String)
	if err != nil {
		return ""
	}
	return s.AsString()
}

// loadTerraform parses and evaluates the module in dir. A module that does
// not parse is nil; problems lists every error.
func loadTerraform(dir string) (*tfModule, []string) {
	m := &tfModule{dir: dir, files: map[string][]byte{}, bodies: map[string]*hclsyntax.Body{},
		vars: map[string]cty.Value{}, locals: map[string]cty.Value{}, localExprs: map[string]hcl.Expression{}}
	paths, err := filepath.Glob(filepath.Join(dir, "*.tf"))
	if err != nil || len(paths) == 0 {
		return nil, []string{fmt.Sprintf("no .tf file in %s (%v)", dir, err)}
	}
	var problems []string
	p := hclparse.NewParser()
	for _, path := range paths {
		src, err := os.ReadFile(path)
		if err != nil {
			return nil, []string{err.Error()}
		}
		name := filepath.Base(path)
		m.files[name] = src
		f, diags := p.ParseHCL(src, path)
		if diags.HasErrors() {
			problems = append(problems, fmt.Sprintf("%s: syntax: %s", name, diags.Error()))
			continue
		}
		body := f.Body.(*hclsyntax.Body)
		m.bodies[name] = body
		for _, blk := range body.Blocks {
			switch blk.Type {
			case "variable":
				m.vars[blk.Labels[0]] = cty.NilVal // required unless it has a default
				if def, ok := blk.Body.Attributes["default"]; ok {
					v, diags := def.Expr.Value(nil)
					if diags.HasErrors() {
						problems = append(problems, fmt.Sprintf("%s: variable %q default: %s", name, blk.Labels[0], diags.Error()))
						continue
					}
					m.vars[blk.Labels[0]] = v
				}
			case "locals":
				for n, a := range blk.Body.Attributes {
					if _, dup := m.localExprs[n]; dup {
						problems = append(problems, fmt.Sprintf("%s: local %q defined twice", name, n))
					}
					m.localExprs[n] = a.Expr
				}
			case "resource", "data":
				m.blocks = append(m.blocks, &tfBlock{mode: blk.Type, typ: blk.Labels[0], name: blk.Labels[1], file: name,
					body: blk.Body, forEach: blk.Body.Attributes["for_each"]})
			}
		}
	}
	if len(problems) > 0 {
		return nil, problems
	}
	problems = append(problems, m.loadTfvars(p)...)
	problems = append(problems, m.evaluate()...)
	return m, problems
}

// loadTfvars overrides the defaults with terraform.tfvars.example, which
// must set every variable without a default and nothing undeclared.
func (m *tfModule) loadTfvars(p *hclparse.Parser) []string {
	const name = "terraform.tfvars.example"
	src, err := os.ReadFile(filepath.Join(m.dir, name))
	if err != nil {
		return []string{err.Error()}
	}
	f, diags := p.ParseHCL(src, name)
	if diags.HasErrors() {
		return []string{fmt.Sprintf("%s: %s", name, diags.Error())}
	}
	attrs, diags := f.Body.JustAttributes()
	if diags.HasErrors() {
		return []string{fmt.Sprintf("%s: %s", name, diags.Error())}
	}
	var problems []string
	for n, a := range attrs {
		if _, ok := m.vars[n]; !ok {
			problems = append(problems, fmt.Sprintf("%s sets %q, which variables.tf does not declare", name, n))
			continue
		}
		v, diags := a.Expr.Value(nil)
		if diags.HasErrors() {
			problems = append(problems, fmt.Sprintf("%s: %s: %s", name, n, diags.Error()))
			continue
		}
		m.vars[n] = v
	}
	for n, v := range m.vars {
		if v == cty.NilVal {
			problems = append(problems, fmt.Sprintf("variable %q has no default and %s does not set it", n, name))
			m.vars[n] = cty.UnknownVal(cty.DynamicPseudoType)
		}
	}
	return problems
}

func (m *tfModule) functions() map[string]function.Function {
	return map[string]function.Function{
		"file": function.New(&function.Spec{
			Params: []function.Parameter{{Name: "path", Type: cty.String}},
			Type:   function.StaticReturnType(cty.String),
			Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
				b, err := os.ReadFile(args[0].AsString())
				return cty.StringVal(string(b)), err
			},
		}),
		"jsondecode": function.New(&function.Spec{
			Params: []function.Parameter{{Name: "json", Type: cty.String}},
			Type: func(args []cty.Value) (cty.Type, error) {
				if !args[0].IsKnown() {
					return cty.DynamicPseudoType, nil
				}
				return ctyjson.ImpliedType([]byte(args[0].AsString()))
			},
			Impl: func(args []cty.Value, ty cty.Type) (cty.Value, error) {
				return ctyjson.Unmarshal([]byte(args[0].AsString()), ty)
			},
		}),
		"toset":      stdlib.MakeToFunc(cty.Set(cty.DynamicPseudoType)),
		"length":     stdlib.LengthFunc,
		"trimsuffix": stdlib.TrimSuffixFunc,
		"contains":   stdlib.ContainsFunc,
		"join":       stdlib.JoinFunc,
		"concat":     stdlib.ConcatFunc,
	}
}

// evaluate fills locals and instances in passes, each pass seeing what the
// previous ones resolved, until nothing more resolves.
func (m *tfModule) evaluate() []string {
	prev := -1
	for pass := 0; pass < 10; pass++ {
		ctx := m.context()
		for n, e := range m.localExprs {
			if v, diags := e.Value(ctx); !diags.HasErrors() {
				m.locals[n] = v
			}
		}
		ctx = m.context()
		for _, b := range m.blocks {
			m.evalInstances(b, ctx)
		}
		if n := m.knownCount(); n == prev {
			break
		} else {
			prev = n
		}
	}
	var problems []string
	for n, e := range m.localExprs {
		if v, ok := m.locals[n]; !ok || !v.IsWhollyKnown() {
			_, diags := e.Value(m.context())
			problems = append(problems, fmt.Sprintf("local.%s does not evaluate: %s", n, diags.Error()))
		}
	}
	for _, b := range m.blocks {
		if b.instances == nil {
			_, diags := b.forEach.Expr.Value(m.context())
			problems = append(problems, fmt.Sprintf("%s (%s): for_each does not evaluate from variables and locals: %s", b.addr(), b.file, diags.Error()))
		}
	}
	sort.Strings(problems)
	return problems
}

func (m *tfModule) knownCount() int {
	n := len(m.locals)
	for _, b := range m.blocks {
		for _, inst := range b.instances {
			for _, v := range inst.attrs {
				if v.IsWhollyKnown() {
					n++
				}
			}
		}
	}
	return n
}

func (m *tfModule) evalInstances(b *tfBlock, ctx *hcl.EvalContext) {
	keys := map[string]cty.Value{"": cty.NilVal}
	if b.forEach != nil {
		v, diags := b.forEach.Expr.Value(ctx)
		if diags.HasErrors() || !v.IsWhollyKnown() || v.IsNull() {
			return
		}
		keys = map[string]cty.Value{}
		for it := v.ElementIterator(); it.Next(); {
			k, val := it.Element()
			if v.Type().IsSetType() {
				k = val
			}
			keys[k.AsString()] = val
		}
	}
	b.instances = map[string]*tfBody{}
	for k, val := range keys {
		ictx := ctx
		if b.forEach != nil {
			ictx = ctx.NewChild()
			ictx.Variables = map[string]cty.Value{"each": cty.ObjectVal(map[string]cty.Value{"key": cty.StringVal(k), "value": val})}
		}
		b.instances[k] = evalBody(b.body, ictx)
	}
}

// evalBody evaluates a body's arguments and nested blocks, expanding
// dynamic blocks; meta-arguments are left out.
func evalBody(body *hclsyntax.Body, ctx *hcl.EvalContext) *tfBody {
	out := &tfBody{attrs: map[string]cty.Value{}, blocks: map[string][]*tfBody{}}
	for n, a := range body.Attributes {
		switch n {
		case "for_each", "depends_on", "count", "provider":
			continue
		}
		v, diags := a.Expr.Value(ctx)
		if diags.HasErrors() {
			v = cty.DynamicVal
		}
		out.attrs[n] = v
	}
	for _, blk := range body.Blocks {
		if blk.Type != "dynamic" {
			out.blocks[blk.Type] = append(out.blocks[blk.Type], evalBody(blk.Body, ctx))
			continue
		}
		name := blk.Labels[0]
		iter := name
		if a, ok := blk.Body.Attributes["iterator"]; ok {
			iter = hcl.ExprAsKeyword(a.Expr)
		}
		var content *hclsyntax.Body
		for _, c := range blk.Body.Blocks {
			if c.Type == "content" {
				content = c.Body
			}
		}
		fe, ok := blk.Body.Attributes["for_each"]
		if !ok || content == nil {
			out.blocks[name] = append(out.blocks[name], &tfBody{attrs: map[string]cty.Value{"<dynamic>": cty.DynamicVal}})
			continue
		}
		coll, diags := fe.Expr.Value(ctx)
		if diags.HasErrors() || !coll.IsWhollyKnown() || coll.IsNull() {
			// Unknown expansion: record one unknown block, so a check
			// counting blocks cannot pass on it.
			out.blocks[name] = append(out.blocks[name], &tfBody{attrs: map[string]cty.Value{"<dynamic>": cty.DynamicVal}})
			continue
		}
		for it := coll.ElementIterator(); it.Next(); {
			k, v := it.Element()
			cctx := ctx.NewChild()
			cctx.Variables = map[string]cty.Value{iter: cty.ObjectVal(map[string]cty.Value{"key": k, "value": v})}
			out.blocks[name] = append(out.blocks[name], evalBody(content, cctx))
		}
	}
	return out
}

// context exposes var, local, path, and every resource and data block as
// Terraform does: <type>.<name> is the instance, or for for_each a map of
// instances by key.
func (m *tfModule) context() *hcl.EvalContext {
	resources := map[string]map[string]cty.Value{}
	data := map[string]map[string]cty.Value{}
	for _, b := range m.blocks {
		if b.instances == nil {
			continue
		}
		var v cty.Value
		if b.forEach == nil {
			v = m.instanceValue(b, b.instances[""])
		} else {
			insts := map[string]cty.Value{}
			for k, inst := range b.instances {
				insts[k] = m.instanceValue(b, inst)
			}
			v = cty.ObjectVal(insts)
		}
		dst := resources
		if b.mode == "data" {
			dst = data
		}
		if dst[b.typ] == nil {
			dst[b.typ] = map[string]cty.Value{}
		}
		dst[b.typ][b.name] = v
	}
	vars := map[string]cty.Value{
		"var":   cty.ObjectVal(m.vars),
		"local": cty.ObjectVal(m.locals),
		"path":  cty.ObjectVal(map[string]cty.Value{"module": cty.StringVal(m.dir)}),
	}
	for typ, byName := range resources {
		vars[typ] = cty.ObjectVal(byName)
	}
	dataTypes := map[string]cty.Value{}
	for typ, byName := range data {
		dataTypes[typ] = cty.ObjectVal(byName)
	}
	vars["data"] = cty.ObjectVal(dataTypes)
	return &hcl.EvalContext{Variables: vars, Functions: m.functions()}
}

// instanceValue is an instance's arguments plus its computed attributes.
func (m *tfModule) instanceValue(b *tfBlock, inst *tfBody) cty.Value {
	attrs := map[string]cty.Value{}
	for n, v := range inst.attrs {
		attrs[n] = v
	}
	for n, v := range m.computed(b.typ, inst) {
		if _, set := attrs[n]; !set {
			attrs[n] = v
		}
	}
	if len(attrs) == 0 {
		return cty.EmptyObjectVal
	}
	return cty.ObjectVal(attrs)
}

// computed returns the attributes the provider computes that the module
// reads, derived as GCP does; unknown where an input is.
func (m *tfModule) computed(typ string, inst *tfBody) map[string]cty.Value {
	project := ""
	if p := m.vars["project_id"]; p.IsKnown() && !p.IsNull() && p.Type() == cty.String {
		project = p.AsString()
	}
	str := func(parts ...string) cty.Value {
		for _, p := range parts {
			if p == "" {
				return cty.UnknownVal(cty.String)
			}
		}
		return cty.StringVal(strings.Join(parts, ""))
	}
	name := inst.str("name")
	switch typ {
	case "google_project":
		return map[string]cty.Value{"number": cty.StringVal(tfTestProjectNumber)}
	case "google_project_service_identity":
		// A Google-managed service agent: service-<project number>@gcp-sa-<api>.iam.gserviceaccount.com.
		api := strings.TrimSuffix(inst.str("service"), ".googleapis.com")
		email := str("service-", tfTestProjectNumber, "@gcp-sa-", api, ".iam.gserviceaccount.com")
		if !email.IsKnown() {
			return map[string]cty.Value{"email": email, "member": email}
		}
		return map[string]cty.Value{"email": email, "member": cty.StringVal("serviceAccount:" + email.AsString())}
	case "google_pubsub_topic":
		return map[string]cty.Value{"id": str("projects/", project, "/topics/", name)}
	case "google_pubsub_subscription":
		return map[string]cty.Value{"id": str("projects/", project, "/subscriptions/", name)}
	case "google_service_account":
		email := str(inst.str("account_id"), "@", project, ".iam.gserviceaccount.com")
		if !email.IsKnown() {
			return map[string]cty.Value{"email": email, "member": email, "name": email, "id": email}
		}
		e := email.AsString()
		return map[string]cty.Value{"email": email, "member": cty.StringVal("serviceAccount:" + e),
			"name": cty.StringVal("projects/" + project + "/serviceAccounts/" + e), "id": cty.StringVal("projects/" + project + "/serviceAccounts/" + e)}
	case "google_sql_database_instance":
		region := inst.str("region")
		return map[string]cty.Value{"connection_name": str(project, ":", region, ":", name), "private_ip_address": cty.StringVal(tfTestSQLPrivateIP)}
	case "google_secret_manager_secret":
		return map[string]cty.Value{"id": str("projects/", project, "/secrets/", inst.str("secret_id"))}
	case "google_artifact_registry_repository":
		return map[string]cty.Value{"name": str(inst.str("repository_id"))}
	}
	return map[string]cty.Value{"id": cty.StringVal(typ + "/" + name)}
}

// resources returns the blocks of a type (mode "resource").
func (m *tfModule) resources(typ string) []*tfBlock {
	var out []*tfBlock
	for _, b := range m.blocks {
		if b.mode == "resource" && b.typ == typ {
			out = append(out, b)
		}
	}
	return out
}

// instancesOf returns every instance of every resource of a type, keyed by
// "<address>[<key>]".
func (m *tfModule) instancesOf(typ string) map[string]*tfBody {
	out := map[string]*tfBody{}
	for _, b := range m.resources(typ) {
		for k, inst := range b.instances {
			addr := b.addr()
			if b.forEach != nil {
				addr = fmt.Sprintf("%s[%q]", addr, k)
			}
			out[addr] = inst
		}
	}
	return out
}
