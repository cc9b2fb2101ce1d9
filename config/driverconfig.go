package config

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"

	"github.com/berth-sh/berth/backend"
)

// DriverConfig decodes the driver "NAME" {} block of driver (an absent block is an
// empty one) against the driver's schema and returns it as the JSON object that
// backend.DriverSetup.Config carries. See DecodeDriverConfig.
func (c *Config) DriverConfig(driver string, schema []backend.ConfigField) ([]byte, error) {
	var body hcl.Body
	if b := c.Drivers[driver]; b != nil {
		body = b.Body
	}
	return DecodeDriverConfig(driver, body, schema)
}

// DecodeDriverConfig decodes a driver block body (nil means no block) against schema
// into a JSON object: "string" → string, "number" → number, "bool" → bool,
// "list(string)" → array of strings, "duration" → a Go duration string
// (time.Duration.String, e.g. "168h0m0s"; the input may use d for days). Unset
// optional attributes are left out. Errors are a *Error (wrapping
// backend.ErrInvalid) with file:line:col: an attribute the schema does not declare
// (listing the valid ones), a nested block, a wrong type, a bad duration, a missing
// required attribute; or an error naming the field when the schema uses an unknown
// type.
func DecodeDriverConfig(driver string, body hcl.Body, schema []backend.ConfigField) ([]byte, error) {
	fields := map[string]backend.ConfigField{}
	for _, f := range schema {
		switch f.Type {
		case "string", "number", "bool", "duration", "list(string)", "map(string)":
		default:
			return nil, backend.Errorf(backend.ErrInvalid, "driver %q declares config field %q with unsupported type %q (want string, number, bool, duration, list(string) or map(string)); this is a bug in the driver", driver, f.Name, f.Type)
		}
		fields[f.Name] = f
	}
	out := map[string]any{}
	d := &decoder{}
	var attrs hcl.Attributes
	if body != nil {
		var diags hcl.Diagnostics
		attrs, diags = body.JustAttributes()
		d.diags = append(d.diags, diags...)
	}
	names := make([]string, 0, len(attrs))
	for n := range attrs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		a := attrs[n]
		f, ok := fields[n]
		if !ok {
			d.errf(a.NameRange, "Unsupported argument", "driver %q has no setting %q. %s", driver, n, validFields(schema))
			continue
		}
		switch f.Type {
		case "string":
			if s, ok := d.str(a); ok {
				out[n] = s
			}
		case "bool":
			if b, ok := d.boolean(a); ok {
				out[n] = b
			}
		case "number":
			if v, ok := d.number(a); ok {
				fv, _ := v.Float64()
				if math.IsInf(fv, 0) {
					d.errf(a.Expr.Range(), "Invalid number", "%q is too large.", n)
					continue
				}
				out[n] = fv
			}
		case "duration":
			if v, ok := d.duration(a); ok {
				out[n] = v.String()
			}
		case "list(string)":
			if l, ok := d.strList(a); ok {
				if l == nil {
					l = []string{}
				}
				out[n] = l
			}
		case "map(string)":
			if m, ok := d.strMap(a); ok {
				if m == nil {
					m = map[string]string{}
				}
				out[n] = m
			}
		}
	}
	for _, f := range schema {
		if !f.Required {
			continue
		}
		if _, set := attrs[f.Name]; set {
			continue
		}
		if body == nil {
			d.diags = append(d.diags, &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "Missing required driver setting",
				Detail:   fmt.Sprintf("driver %q needs %q (%s%s); add driver %q { %s = ... } to the config.", driver, f.Name, f.Type, describe(f), driver, f.Name),
			})
			continue
		}
		d.errf(body.MissingItemRange(), "Missing required driver setting", "driver %q needs %q (%s%s); add it to this block.", driver, f.Name, f.Type, describe(f))
	}
	if d.diags.HasErrors() {
		return nil, &Error{Diagnostics: d.diags}
	}
	return json.Marshal(out)
}

func describe(f backend.ConfigField) string {
	if f.Description == "" {
		return ""
	}
	return ": " + f.Description
}

func validFields(schema []backend.ConfigField) string {
	if len(schema) == 0 {
		return "This driver takes no settings; remove the attribute."
	}
	var parts []string
	for _, f := range schema {
		parts = append(parts, fmt.Sprintf("%s (%s)", f.Name, f.Type))
	}
	slices.Sort(parts)
	return "Valid settings: " + strings.Join(parts, ", ") + "."
}
