package hermes

import (
	"testing"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"golang.org/x/text/unicode/norm"
)

// FuzzQuote checks that HCL's parser reads every string that quote writes back as
// it was: a block label exactly, and an attribute, a list element, an object key
// and value up to the NFC normalisation HCL applies to string templates (U+2000
// reads back as U+2002, as it does from hclwrite's output; that input is kept as
// a seed).
func FuzzQuote(f *testing.F) {
	for _, s := range []string{"", "plain", `a "quoted" \ back`, "${var} %{if x}", "$$${", "%", "$", "tab\tnl\nret\r", "\x00\x01\x7f", "é ü 日本", "\u2028\u00ad\ufeff", "\U0001F600", "{", "}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			t.Skip("YAML hands Import valid UTF-8 only")
		}
		want := norm.NFC.String(s)
		var file body
		b := file.newBlock("scope", s)
		b.setString("str", s)
		b.set("list", listVal{s, "x"})
		b.set("obj", objVal{"k": s, s + "-key": "v"})
		src := file.bytes()
		f, diags := hclsyntax.ParseConfig(src, "fuzz.hcl", hcl.InitialPos)
		if diags.HasErrors() {
			t.Fatalf("%q: the written HCL does not parse: %v\n%s", s, diags, src)
		}
		blocks := f.Body.(*hclsyntax.Body).Blocks
		if len(blocks) != 1 || len(blocks[0].Labels) != 1 || blocks[0].Labels[0] != s {
			t.Fatalf("%q: label read back as %q\n%s", s, blocks[0].Labels, src)
		}
		attrs := blocks[0].Body.Attributes
		get := func(name string) cty.Value {
			v, diags := attrs[name].Expr.Value(nil)
			if diags.HasErrors() {
				t.Fatalf("%q: %s: %v\n%s", s, name, diags, src)
			}
			return v
		}
		if v := get("str"); v.AsString() != want {
			t.Fatalf("%q: read back as %q\n%s", s, v.AsString(), src)
		}
		if v := get("list").AsValueSlice(); v[0].AsString() != want || v[1].AsString() != "x" {
			t.Fatalf("%q: list read back as %#v\n%s", s, v, src)
		}
		obj := get("obj").AsValueMap()
		if obj["k"].AsString() != want || obj[norm.NFC.String(s+"-key")].AsString() != "v" {
			t.Fatalf("%q: object read back as %#v\n%s", s, obj, src)
		}
	})
}
