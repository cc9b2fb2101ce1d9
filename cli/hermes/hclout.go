package hermes

import (
	"bytes"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode"

	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// This file writes the one rule Import prints. It stands in for hclwrite, which
// links github.com/google/go-cmp: that package's initialisers cost every berth
// command, whatever it does, about 0.6 ms of its start (GODEBUG=inittrace=1; 4 %
// of a whole `berth exec`), for the sake of this one translation. What is written
// here is small: blocks with labels, and attributes whose values are strings,
// numbers, booleans, lists of strings and objects of strings. Strings are quoted as
// hclwrite quotes them (escapes, doubled template introducers, \u for what is not
// printable); FuzzQuote checks that HCL's parser reads every string back as it
// was, and the output is laid out as hclwrite.Format lays it out (two spaces a
// level, the = of neighbouring one-line attributes aligned).

// body is a block's body: attributes, nested blocks and blank lines, in order.
type body struct {
	items []item
}

// item is one line group of a body: an attribute, a block, or a blank line.
type item struct {
	name   string
	value  value  // an attribute's
	block  *block // a block
	isLine bool   // a blank line
}

// block is a nested block: its type, labels and body.
type block struct {
	typ    string
	labels []string
	body   body
}

// value is an attribute's value: written by its write method at the indent given.
type value interface {
	write(buf *bytes.Buffer, indent string)
}

type (
	strVal  string
	boolVal bool
	numVal  float64
	listVal []string
	objVal  map[string]string
)

// set sets the attribute name to v, in place when the body has it already (as
// hclwrite's SetAttributeValue does), else at the end.
func (b *body) set(name string, v value) {
	for i := range b.items {
		if b.items[i].name == name && b.items[i].block == nil && !b.items[i].isLine {
			b.items[i].value = v
			return
		}
	}
	b.items = append(b.items, item{name: name, value: v})
}

// setString, setBool and setNumber set an attribute of that type.
func (b *body) setString(name, s string)         { b.set(name, strVal(s)) }
func (b *body) setBool(name string, v bool)      { b.set(name, boolVal(v)) }
func (b *body) setNumber(name string, f float64) { b.set(name, numVal(f)) }

// newline appends a blank line.
func (b *body) newline() { b.items = append(b.items, item{isLine: true}) }

// newBlock appends a block of type typ with labels and returns its body.
func (b *body) newBlock(typ string, labels ...string) *body {
	blk := &block{typ: typ, labels: labels}
	b.items = append(b.items, item{block: blk})
	return &blk.body
}

// bytes is the file whose top-level body is b.
func (b *body) bytes() []byte {
	var buf bytes.Buffer
	b.write(&buf, "")
	return buf.Bytes()
}

// write writes b's items at indent. Each run of one-line attributes (no blank
// line, block or object between them) has its = signs aligned.
func (b *body) write(buf *bytes.Buffer, indent string) {
	for i := 0; i < len(b.items); {
		it := b.items[i]
		switch {
		case it.isLine:
			buf.WriteString("\n")
			i++
		case it.block != nil:
			buf.WriteString(indent + it.block.typ)
			for _, l := range it.block.labels {
				buf.WriteString(" " + quote(l))
			}
			buf.WriteString(" {\n")
			it.block.body.write(buf, indent+"  ")
			buf.WriteString(indent + "}\n")
			i++
		default:
			// A run ends at a blank line, a block or an object (whose lines are
			// its own: it stands alone, its = not aligned with its neighbours').
			j := i + 1
			if _, obj := it.value.(objVal); !obj {
				for j < len(b.items) && b.items[j].block == nil && !b.items[j].isLine {
					if _, obj := b.items[j].value.(objVal); obj {
						break
					}
					j++
				}
			}
			width := 0
			for _, a := range b.items[i:j] {
				width = max(width, len(a.name))
			}
			for ; i < j; i++ {
				a := b.items[i]
				fmt.Fprintf(buf, "%s%-*s = ", indent, width, a.name)
				a.value.write(buf, indent)
				buf.WriteString("\n")
			}
		}
	}
}

func (s strVal) write(buf *bytes.Buffer, _ string) { buf.WriteString(quote(string(s))) }

func (v boolVal) write(buf *bytes.Buffer, _ string) { buf.WriteString(strconv.FormatBool(bool(v))) }

func (f numVal) write(buf *bytes.Buffer, _ string) {
	buf.WriteString(strconv.FormatFloat(float64(f), 'f', -1, 64))
}

func (l listVal) write(buf *bytes.Buffer, _ string) {
	buf.WriteString("[")
	for i, s := range l {
		if i > 0 {
			buf.WriteString(", ")
		}
		buf.WriteString(quote(s))
	}
	buf.WriteString("]")
}

// write writes the object on lines of its own, keys sorted and their = aligned;
// a key that is not an identifier is quoted.
func (o objVal) write(buf *bytes.Buffer, indent string) {
	keys := make([]string, 0, len(o))
	width := 0
	for k := range o {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = k
		if !hclsyntax.ValidIdentifier(k) {
			names[i] = quote(k)
		}
		width = max(width, len(names[i]))
	}
	buf.WriteString("{\n")
	for i, k := range keys {
		fmt.Fprintf(buf, "%s  %-*s = %s\n", indent, width, names[i], quote(o[k]))
	}
	buf.WriteString(indent + "}")
}

// quote returns s as an HCL quoted string literal: \n, \r, \t, \" and \\
// escaped, ${ and %{ written $${ and %%{ (so no template is read into them), and
// every rune that is not printable as \uXXXX or \UXXXXXXXX.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i, r := range s {
		switch r {
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '$', '%':
			b.WriteRune(r)
			if strings.HasPrefix(s[i+1:], "{") {
				b.WriteRune(r)
			}
		default:
			switch {
			case unicode.IsPrint(r):
				b.WriteRune(r)
			case r < 0x10000:
				fmt.Fprintf(&b, `\u%04x`, r)
			default:
				fmt.Fprintf(&b, `\U%08x`, r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}
