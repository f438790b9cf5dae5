// Package config reads InferenceGatewayConfig documents from files: strict decoding
// (an unknown field or a value of the wrong type is an error naming the field and
// its line), defaults and validation.
package config

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/api/v1alpha1"
)

// Error lists every problem found in a document, each with its line.
type Error struct {
	File     string
	Problems []Problem
}

// Problem is one error at a line (0 when the line is unknown).
type Problem struct {
	Line    int
	Path    string
	Message string
}

func (e *Error) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(e.File)
		if p.Line > 0 {
			fmt.Fprintf(&b, ":%d", p.Line)
		}
		b.WriteString(": ")
		if p.Path != "" {
			b.WriteString(p.Path + ": ")
		}
		b.WriteString(p.Message)
	}
	return b.String()
}

// Messages lists the problems as "path: message", without file or line: for a
// resource read from the API server, whose lines mean nothing to its author.
func (e *Error) Messages() []string {
	out := make([]string, 0, len(e.Problems))
	for _, p := range e.Problems {
		if p.Path != "" {
			out = append(out, p.Path+": "+p.Message)
		} else {
			out = append(out, p.Message)
		}
	}
	return out
}

// Load reads and checks the document in path.
func Load(path string) (*v1alpha1.InferenceGatewayConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse decodes and checks an InferenceGatewayConfig; name labels the errors.
func Parse(name string, data []byte) (*v1alpha1.InferenceGatewayConfig, error) {
	var cfg v1alpha1.InferenceGatewayConfig
	doc, err := Decode(name, data, &cfg, "InferenceGatewayConfig", "apiVersion, kind, metadata and spec")
	if err != nil {
		return nil, err
	}
	errs := Kind(cfg.APIVersion, cfg.Kind, v1alpha1.APIVersion, v1alpha1.Kind)
	if err := doc.Check(append(errs, cfg.Validate()...)); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// Document is a file Decode read, kept for the lines of problems found after
// decoding.
type Document struct {
	name       string
	root       *yaml.Node // the document's top mapping
	deprecated []string
}

// Renamed is a field's former name, still read for a release: in the
// mapping at Path (such as spec.auth.jwt), the key Old is read as New.
type Renamed struct {
	Path, Old, New string
}

// Deprecated lists the former names the document used, one line each, such
// as "global.yaml:7: spec.auth.jwt.jwksURL is deprecated; use jwksURI": for
// the caller to log once when it applies the document.
func (d *Document) Deprecated() []string { return d.deprecated }

// Decode reads the one YAML (or JSON) document in data into out, strictly:
// an unknown field or a value of the wrong kind is a problem naming its
// field path and line, and every one is reported at once; so is a file with
// no document, or more than one. what names the document and fields its
// top-level fields, for messages. A field under a name in renamed is read
// under its new name, noted in the Document's Deprecated; one given under
// both names is a problem. Every configuration file kvgate reads goes through
// here.
func Decode(name string, data []byte, out any, what, fields string, renamed ...Renamed) (*Document, error) {
	fail := func(ps ...Problem) error { return &Error{File: name, Problems: ps} }
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil && !errors.Is(err, io.EOF) {
		return nil, fail(yamlProblem(err))
	}
	var second yaml.Node
	if err := dec.Decode(&second); !errors.Is(err, io.EOF) {
		line := second.Line
		if err != nil {
			return nil, fail(yamlProblem(err))
		}
		return nil, fail(Problem{Line: line, Message: "the file holds more than one document; kvgate reads exactly one " + what})
	}
	if root.Kind == 0 || len(root.Content) == 0 {
		return nil, fail(Problem{Message: "the document is empty"})
	}
	doc := root.Content[0]
	if doc.Kind != yaml.MappingNode {
		return nil, fail(Problem{Line: doc.Line, Message: "the document must be a mapping with " + fields})
	}
	d := &Document{name: name, root: doc}
	problems := d.rename(renamed)
	walk(doc, reflect.TypeOf(out), "", &problems)
	if len(problems) > 0 {
		return nil, fail(problems...)
	}
	if len(d.deprecated) > 0 {
		// The keys were renamed in the tree: decode that. Lines of later
		// problems still come from the tree, which keeps them.
		var err error
		if data, err = yaml.Marshal(&root); err != nil {
			return nil, fail(Problem{Message: err.Error()})
		}
	}
	if err := sigsyaml.UnmarshalStrict(data, out); err != nil {
		return nil, fail(Problem{Message: err.Error()})
	}
	return d, nil
}

// rename gives the document's fields in renamed their new names, noting each
// in d.deprecated; a field given under both names is a problem.
func (d *Document) rename(renamed []Renamed) []Problem {
	var problems []Problem
	for _, r := range renamed {
		m := mappingAt(d.root, r.Path)
		if m == nil {
			continue
		}
		oldAt, newAt := -1, -1
		for i := 0; i+1 < len(m.Content); i += 2 {
			switch m.Content[i].Value {
			case r.Old:
				oldAt = i
			case r.New:
				newAt = i
			}
		}
		if oldAt < 0 {
			continue
		}
		k := m.Content[oldAt]
		if newAt >= 0 {
			problems = append(problems, Problem{Line: k.Line, Path: join(r.Path, r.Old),
				Message: fmt.Sprintf("is the deprecated name of %s, which is set too: keep only %s", r.New, r.New)})
			// Dropped so that the walk does not call it unknown as well.
			m.Content = slices.Delete(m.Content, oldAt, oldAt+2)
			continue
		}
		k.Value = r.New
		d.deprecated = append(d.deprecated, fmt.Sprintf("%s:%d: %s is deprecated; use %s", d.name, k.Line, join(r.Path, r.Old), r.New))
	}
	return problems
}

// mappingAt is the mapping at a path of keys such as spec.auth.jwt, or nil.
func mappingAt(n *yaml.Node, path string) *yaml.Node {
	for _, part := range splitPath(path) {
		if _, n = child(n, part); n == nil {
			return nil
		}
	}
	if n = deref(n); n.Kind != yaml.MappingNode {
		return nil
	}
	return n
}

// Check is nil when errs is empty, else an *Error listing each with the line
// of its field (or of the nearest parent the file has).
func (d *Document) Check(errs []v1alpha1.FieldError) error {
	if len(errs) == 0 {
		return nil
	}
	e := &Error{File: d.name}
	for _, fe := range errs {
		e.Problems = append(e.Problems, Problem{Line: lineOf(d.root, fe.Path), Path: fe.Path, Message: fe.Message})
	}
	return e
}

// Kind checks a document's apiVersion and kind.
func Kind(apiVersion, kind, wantAPIVersion, wantKind string) []v1alpha1.FieldError {
	var errs []v1alpha1.FieldError
	if apiVersion != wantAPIVersion {
		errs = append(errs, v1alpha1.FieldError{Path: "apiVersion", Message: fmt.Sprintf("is %q, want %q", apiVersion, wantAPIVersion)})
	}
	if kind != wantKind {
		errs = append(errs, v1alpha1.FieldError{Path: "kind", Message: fmt.Sprintf("is %q, want %q", kind, wantKind)})
	}
	return errs
}

var yamlLine = regexp.MustCompile(`line (\d+)`)

func yamlProblem(err error) Problem {
	p := Problem{Message: "not valid YAML: " + err.Error()}
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		p.Line, _ = strconv.Atoi(m[1])
	}
	return p
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// walk checks a YAML node against the Go type it will decode into: unknown fields
// and scalars of the wrong kind, with their lines.
func walk(n *yaml.Node, t reflect.Type, path string, out *[]Problem) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Tag == "!!null" {
		return
	}
	add := func(msg string) { *out = append(*out, Problem{Line: n.Line, Path: path, Message: msg}) }
	// Types that decode themselves (durations, quantities, times) are tried on
	// their scalar here, so that a bad one is reported at its field rather than
	// as a decoder error with no path.
	if reflect.PointerTo(t).Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler) {
		if n.Kind == yaml.ScalarNode {
			if err := decodeScalar(n.Value, t); err != nil {
				msg := err.Error()
				if !strings.Contains(msg, n.Value) {
					msg = fmt.Sprintf("%q: %s", n.Value, msg)
				}
				add(msg)
			}
		}
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			add("must be a mapping")
			return
		}
		fields := jsonFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			f, ok := fields[k.Value]
			if !ok {
				names := make([]string, 0, len(fields))
				for name := range fields {
					names = append(names, name)
				}
				slices.Sort(names)
				*out = append(*out, Problem{Line: k.Line, Path: join(path, k.Value), Message: "unknown field (known: " + strings.Join(names, ", ") + ")"})
				continue
			}
			walk(v, f, join(path, k.Value), out)
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			add("must be a list")
			return
		}
		for i, item := range n.Content {
			walk(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i), out)
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			add("must be a mapping")
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			walk(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value), out)
		}
	case reflect.String:
		// An unquoted 3.10 or 0x1F would silently become "3.1" or "31".
		if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
			add(fmt.Sprintf("must be a string, got %q (quote it)", n.Value))
		}
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
			add(fmt.Sprintf("must be true or false, got %q", n.Value))
		}
	case reflect.Int, reflect.Int32, reflect.Int64, reflect.Uint32, reflect.Uint64:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
			add(fmt.Sprintf("must be an integer, got %q", n.Value))
			break
		}
		// A value the field cannot hold would fail decoding with no path.
		bits := t.Bits()
		if t.Kind() == reflect.Uint32 || t.Kind() == reflect.Uint64 {
			if _, err := strconv.ParseUint(n.Value, 0, bits); err != nil {
				add(fmt.Sprintf("must be an integer between 0 and %d, got %s", uint64(1)<<bits-1, n.Value))
			}
		} else if _, err := strconv.ParseInt(n.Value, 0, bits); err != nil {
			add(fmt.Sprintf("must be an integer between %d and %d, got %s", -(int64(1) << (bits - 1)), int64(1)<<(bits-1)-1, n.Value))
		}
	case reflect.Float32, reflect.Float64:
		if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
			add(fmt.Sprintf("must be a number, got %q", n.Value))
		}
	}
}

// decodeScalar decodes one YAML scalar into a new value of a self-decoding type.
func decodeScalar(v string, t reflect.Type) error {
	ptr := reflect.New(t)
	if u, ok := ptr.Interface().(json.Unmarshaler); ok {
		raw, _ := json.Marshal(v)
		return u.UnmarshalJSON(raw)
	}
	return ptr.Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(v))
}

// jsonFields maps a struct's JSON names to field types, following inlined fields.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && (name == "" || strings.Contains(opts, "inline")) {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			for k, v := range jsonFields(ft) {
				out[k] = v
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// lineOf finds the line of a field path like spec.schedulers[1].modelName, or of its
// nearest existing parent.
func lineOf(doc *yaml.Node, path string) int {
	n := doc
	line := doc.Line
	for _, part := range splitPath(path) {
		key, next := child(n, part)
		switch {
		case next == nil:
			return line
		case key != nil:
			line = key.Line
		default:
			line = next.Line
		}
		n = next
	}
	return line
}

// child is the node a path part names in n (an alias read as its anchor),
// with its key when n is a mapping; nil when n has no such node.
func child(n *yaml.Node, part pathPart) (key, value *yaml.Node) {
	n = deref(n)
	switch {
	case part.index >= 0 && n.Kind == yaml.SequenceNode && part.index < len(n.Content):
		return nil, n.Content[part.index]
	case part.index < 0 && n.Kind == yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == part.key {
				return n.Content[i], n.Content[i+1]
			}
		}
	}
	return nil, nil
}

func deref(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode {
		return n.Alias
	}
	return n
}

type pathPart struct {
	key   string
	index int
}

func splitPath(path string) []pathPart {
	var out []pathPart
	for _, seg := range strings.Split(path, ".") {
		key, rest, _ := strings.Cut(seg, "[")
		if key != "" {
			out = append(out, pathPart{key: key, index: -1})
		}
		for rest != "" {
			num, after, _ := strings.Cut(rest, "]")
			i, err := strconv.Atoi(num)
			if err != nil {
				break
			}
			out = append(out, pathPart{index: i})
			_, rest, _ = strings.Cut(after, "[")
		}
	}
	return out
}

// Marshal renders a configuration as YAML, for /debug/config.
func Marshal(cfg *v1alpha1.InferenceGatewayConfig) ([]byte, error) {
	if cfg == nil {
		return nil, errors.New("no configuration")
	}
	b, err := sigsyaml.Marshal(cfg)
	return bytes.TrimSpace(b), err
}
