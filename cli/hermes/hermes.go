// Package hermes translates the terminal settings of a hermes-agent config file
// (hermes's ~/.hermes/config.yaml, its `terminal:` section; NousResearch/hermes-agent,
// cli-config.yaml.example and website/docs/user-guide/configuration.md "Docker Backend")
// into a berth config: one `scope` rule for the sessions the berth hermes plugin uses
// (clients/hermes; session names `hermes:{task_id}` by default), in HCL that
// package config parses. It is what `berth config import hermes FILE` prints.
//
// A key with no berth equivalent is left out of the rule and reported as a Note
// saying why; a value of the wrong type or form is an error naming file:line:col and
// the key. Keys hermes leaves unset take hermes's defaults (tools/terminal_tool_backends.py
// _CONTAINER_KEYS: docker_network true, container_cpu 1, container_memory 5120 MB;
// docker_image "nikolaik/python-nodejs:python3.11-nodejs20"; backend "local"), so the
// sandbox berth makes looks like the one hermes made.
package hermes

import (
	"bytes"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
	"go.yaml.in/yaml/v3"
)

// DefaultGlob is the scope glob of the rule Import writes: the session names the
// berth hermes plugin (clients/hermes) makes from hermes task ids by default.
const DefaultGlob = "hermes:*"

// DefaultSharedName is the `name` of the shared sandbox the rule asks for when
// hermes's container_persistent is true (hermes's default: one container shared
// by every session) and docker_shared_container_key is unset.
const DefaultSharedName = "hermes"

// DefaultDockerImage is hermes-agent's default docker_image, used when the file sets none.
const DefaultDockerImage = "nikolaik/python-nodejs:python3.11-nodejs20"

// Options changes what Import writes. The zero value is usable.
type Options struct {
	// Glob is the rule's scope glob; "" means DefaultGlob. It must be a valid
	// berth glob (config.ValidateGlob).
	Glob string
	// Home is the directory a leading "~" of a docker_volumes host path stands
	// for (hermes expands it with the user's home). "" refuses such a path.
	Home string
}

// Note is one hermes key that the berth rule does not carry, with the reason
// and what to do instead. Pos is "file:line:col" of the key in the YAML file.
type Note struct {
	Pos     string
	Key     string // e.g. "terminal.container_disk"
	Message string
}

// String gives the note as the CLI prints it: "FILE:LINE:COL: terminal.KEY: MESSAGE".
func (n Note) String() string { return n.Pos + ": " + n.Key + ": " + n.Message }

// Result is a translated config: HCL, a whole berth config file that
// config.Parse accepts (with the docker and local drivers known), and the notes
// on keys that it does not carry, in file order.
type Result struct {
	HCL   []byte
	Notes []Note
}

// entry is one key of the terminal section.
type entry struct {
	key, val *yaml.Node
	used     bool
}

type importer struct {
	file    string
	opts    Options
	entries map[string]*entry
	order   []string
	notes   []Note
}

// Import translates the hermes-agent config file src (YAML; filename is used in
// positions) into a berth config. It returns an error wrapping backend.ErrInvalid
// when src is not YAML, has no `terminal:` mapping, names a backend berth has no
// driver for (berth translates hermes's "local" and "docker"), or holds a value of
// the wrong type or form (each error names file:line:col, the key and the fix).
func Import(src []byte, filename string, opts Options) (*Result, error) {
	if opts.Glob == "" {
		opts.Glob = DefaultGlob
	}
	if err := config.ValidateGlob(opts.Glob); err != nil {
		return nil, fmt.Errorf("%w: scope glob: %v", backend.ErrInvalid, err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, fmt.Errorf("%w: %s is not YAML: %v", backend.ErrInvalid, filename, err)
	}
	im := &importer{file: filename, opts: opts, entries: map[string]*entry{}}
	term, err := im.terminal(&doc)
	if err != nil {
		return nil, err
	}
	for i := 0; i+1 < len(term.Content); i += 2 {
		k, v := term.Content[i], term.Content[i+1]
		if _, dup := im.entries[k.Value]; dup {
			return nil, im.errf(k, k.Value, "is set twice in the terminal section; keep one")
		}
		im.entries[k.Value] = &entry{key: k, val: v}
		im.order = append(im.order, k.Value)
	}
	out, err := im.translate()
	if err != nil {
		return nil, err
	}
	// Every key not consumed gets a note, in file order.
	for _, name := range im.order {
		if e := im.entries[name]; !e.used {
			im.note(name, unknownReason(name))
		}
	}
	slices.SortStableFunc(im.notes, func(a, b Note) int { return im.line(a.Key) - im.line(b.Key) })
	return &Result{HCL: out, Notes: im.notes}, nil
}

// terminal finds the `terminal:` mapping of the document.
func (im *importer) terminal(doc *yaml.Node) (*yaml.Node, error) {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil, fmt.Errorf("%w: %s is empty: want hermes-agent's config.yaml (~/.hermes/config.yaml) with a terminal: section", backend.ErrInvalid, im.file)
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%w: %s:%d:%d: the file is not a YAML mapping: want hermes-agent's config.yaml with a terminal: section", backend.ErrInvalid, im.file, root.Line, root.Column)
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "terminal" {
			t := root.Content[i+1]
			if t.Kind != yaml.MappingNode {
				return nil, fmt.Errorf("%w: %s:%d:%d: terminal: is not a mapping of settings (backend: docker, docker_image: IMAGE and so on)", backend.ErrInvalid, im.file, t.Line, t.Column)
			}
			return t, nil
		}
	}
	return nil, fmt.Errorf("%w: %s has no terminal: section: want hermes-agent's config.yaml (~/.hermes/config.yaml), whose terminal: section holds backend, docker_image and the other settings", backend.ErrInvalid, im.file)
}

func (im *importer) pos(n *yaml.Node) string {
	return fmt.Sprintf("%s:%d:%d", im.file, n.Line, n.Column)
}

func (im *importer) line(key string) int {
	if e := im.entries[strings.TrimPrefix(key, "terminal.")]; e != nil {
		return e.key.Line
	}
	return 0
}

func (im *importer) errf(n *yaml.Node, key, format string, args ...any) error {
	return fmt.Errorf("%w: %s: terminal.%s %s", backend.ErrInvalid, im.pos(n), key, fmt.Sprintf(format, args...))
}

// note records that key has no equivalent in the rule.
func (im *importer) note(key, msg string) {
	e := im.entries[key]
	e.used = true
	im.notes = append(im.notes, Note{Pos: im.pos(e.key), Key: "terminal." + key, Message: msg})
}

// noteIf notes key when the file sets it.
func (im *importer) noteIf(key, msg string) {
	if e := im.entries[key]; e != nil && !e.used {
		im.note(key, msg)
	}
}

// take returns key's value node and marks it used, or nil when unset (or null).
func (im *importer) take(key string) *yaml.Node {
	e := im.entries[key]
	if e == nil {
		return nil
	}
	e.used = true
	if e.val.Kind == yaml.ScalarNode && e.val.Tag == "!!null" {
		return nil
	}
	return e.val
}

func (im *importer) str(key, def string) (string, *yaml.Node, error) {
	v := im.take(key)
	if v == nil {
		return def, nil, nil
	}
	if v.Kind != yaml.ScalarNode {
		return "", nil, im.errf(v, key, "must be a string, e.g. %s: %q", key, def)
	}
	return strings.TrimSpace(v.Value), v, nil
}

// boolean reads key as hermes does: a YAML boolean, or the strings true/false,
// yes/no, 1/0 (hermes's TERMINAL_* parsing), any case.
func (im *importer) boolean(key string, def bool) (bool, error) {
	v := im.take(key)
	if v == nil {
		return def, nil
	}
	if v.Kind == yaml.ScalarNode {
		switch strings.ToLower(strings.TrimSpace(v.Value)) {
		case "true", "yes", "on", "1":
			return true, nil
		case "false", "no", "off", "0":
			return false, nil
		}
	}
	return false, im.errf(v, key, "must be true or false, not %q", v.Value)
}

// number reads key as a non-negative number (hermes's resource keys).
func (im *importer) number(key string, def float64) (float64, *yaml.Node, error) {
	v := im.take(key)
	if v == nil {
		return def, nil, nil
	}
	if v.Kind == yaml.ScalarNode {
		if f, err := strconv.ParseFloat(strings.TrimSpace(v.Value), 64); err == nil && f >= 0 {
			return f, v, nil
		}
	}
	return 0, nil, im.errf(v, key, "must be a number ≥ 0, not %q", v.Value)
}

func (im *importer) strList(key string) ([]string, *yaml.Node, error) {
	v := im.take(key)
	if v == nil {
		return nil, nil, nil
	}
	if v.Kind != yaml.SequenceNode {
		return nil, nil, im.errf(v, key, "must be a list of strings, e.g. [\"A\", \"B\"]")
	}
	var out []string
	for _, it := range v.Content {
		if it.Kind != yaml.ScalarNode || it.Tag == "!!null" {
			return nil, nil, im.errf(it, key, "must be a list of strings; this item is not a string")
		}
		out = append(out, it.Value)
	}
	return out, v, nil
}

func (im *importer) strMap(key string) ([][2]string, *yaml.Node, error) {
	v := im.take(key)
	if v == nil {
		return nil, nil, nil
	}
	if v.Kind != yaml.MappingNode {
		return nil, nil, im.errf(v, key, "must be a mapping of NAME: value, e.g. {DEBUG: \"1\"}")
	}
	var out [][2]string
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, val := v.Content[i], v.Content[i+1]
		if val.Kind != yaml.ScalarNode || val.Tag == "!!null" {
			return nil, nil, im.errf(val, key, "value of %s must be a string", k.Value)
		}
		if k.Value == "" || strings.ContainsAny(k.Value, "=\x00") {
			return nil, nil, im.errf(k, key, "has the variable name %q: names are non-empty and have no = or NUL", k.Value)
		}
		out = append(out, [2]string{k.Value, val.Value})
	}
	return out, v, nil
}

// translate builds the rule from the entries.
func (im *importer) translate() ([]byte, error) {
	backendName, bnode, err := im.str("backend", "local")
	if err != nil {
		return nil, err
	}
	backendName = strings.ToLower(backendName)
	var file body
	rule := file.newBlock("scope", im.opts.Glob)
	switch backendName {
	case "docker":
		if err := im.docker(rule); err != nil {
			return nil, err
		}
	case "local":
		if err := im.local(rule); err != nil {
			return nil, err
		}
	default:
		at := im.file
		if bnode != nil {
			at = im.pos(bnode)
		}
		return nil, fmt.Errorf("%w: %s: terminal.backend %q has no berth driver: berth config import hermes translates hermes's local and docker backends (berth's local and docker drivers); write the scope rule for another runtime by hand (docs/configuration.md)", backend.ErrInvalid, at, backendName)
	}
	im.commonNotes(backendName)
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# Translated from the terminal: section of %s by `berth config import hermes`.\n", filepath.Base(im.file))
	fmt.Fprintf(&buf, "# The rule covers the sessions of the berth hermes plugin (%s); add rules for\n", im.opts.Glob)
	buf.WriteString("# other sessions before or after it (docs/hermes.md, docs/configuration.md).\n")
	buf.Write(file.bytes())
	return buf.Bytes(), nil
}

func (im *importer) local(rule *body) error {
	rule.setString("driver", "local")
	if err := im.workdir(rule, "without it a local sandbox starts in its own private home"); err != nil {
		return err
	}
	pass, _, err := im.strList("env_passthrough")
	if err != nil {
		return err
	}
	if len(pass) > 0 {
		rule.set("env_passthrough", listVal(pass))
	}
	rule.newline()
	rule.newBlock("retention").setString("on_close", "keep")
	for _, k := range im.order {
		if strings.HasPrefix(k, "docker_") || strings.HasPrefix(k, "container_") {
			im.noteIf(k, "applies to hermes's docker backend only; the backend here is local")
		}
	}
	return nil
}

func (im *importer) docker(rule *body) error {
	rule.setString("driver", "docker")
	image, _, err := im.str("docker_image", DefaultDockerImage)
	if err != nil {
		return err
	}
	if image == "" {
		image = DefaultDockerImage
	}
	rule.setString("image", image)

	// hermes's switch between one container for every session and one per session:
	// container_persistent (default true). With true, every session's task resolves
	// to "default", one long-lived container per profile (tools/terminal_tool.py
	// _resolve_container_task_id, _docker_persistent_profile_scoped); with false,
	// each session has its own container, kept between turns and removed when the
	// session closes or idles past lifetime_seconds (terminal_tool_backends.py
	// _build_docker_env, session_scoped; docker.py DockerEnvironment._session_scoped).
	persistent, err := im.boolean("container_persistent", true)
	if err != nil {
		return err
	}
	if persistent {
		name, knode, err := im.str("docker_shared_container_key", "")
		if err != nil {
			return err
		}
		if name == "" {
			name = DefaultSharedName
		} else if err := config.ValidateSession(name); err != nil {
			return im.errf(knode, "docker_shared_container_key", "%q cannot name berth's shared sandbox: %v", name, err)
		}
		rule.setString("isolation", "shared")
		rule.setString("name", name)
		if im.entries["container_persistent"] != nil {
			// Translated (isolation), but where the files live differs.
			im.note("container_persistent", "translated as one shared sandbox; hermes also keeps /root and /workspace in host directories (~/.hermes/sandboxes/docker/default/home and .../workspace), a berth sandbox in the container for as long as it exists (stop keeps them, berth rm deletes them): to keep hermes's files, add mount blocks for those directories")
		}
	} else {
		rule.setString("isolation", "session")
		im.noteIf("docker_shared_container_key", "names hermes's one shared container, which container_persistent: false does not use: every session has its own sandbox")
	}
	for _, k := range []string{"docker_container_scope", "docker_session_container_retention", "docker_session_container_ttl_seconds"} {
		im.noteIf(k, "a key of hermes-agent PR #106219, which was not merged: no hermes code reads it, so it is left out; container_persistent decides whether each session has its own sandbox (false) or all share one (true, hermes's default)")
	}

	if err := im.workdir(rule, "without it execs start in the image's WORKDIR"); err != nil {
		return err
	}
	env, _, err := im.strMap("docker_env")
	if err != nil {
		return err
	}
	if len(env) > 0 {
		m := objVal{}
		for _, kv := range env {
			m[kv[0]] = kv[1]
		}
		rule.set("env", m)
	}
	host, err := im.boolean("docker_run_as_host_user", false)
	if err != nil {
		return err
	}
	if host {
		rule.setString("user", "host")
	}
	network, err := im.boolean("docker_network", true)
	if err != nil {
		return err
	}
	if network {
		rule.setString("network", "bridge")
	} else {
		rule.setString("network", "none")
	}

	vols, vnode, err := im.strList("docker_volumes")
	if err != nil {
		return err
	}
	for _, v := range vols {
		src, dst, ro, err := im.volume(v)
		if err != nil {
			return im.errf(vnode, "docker_volumes", "entry %q: %v", v, err)
		}
		rule.newline()
		m := rule.newBlock("mount")
		m.setString("source", src)
		m.setString("target", dst)
		if ro {
			m.setBool("read_only", true)
		}
	}

	cpu, _, err := im.number("container_cpu", 1)
	if err != nil {
		return err
	}
	mem, _, err := im.number("container_memory", 5120)
	if err != nil {
		return err
	}
	rule.newline()
	res := rule.newBlock("resources")
	if cpu > 0 {
		if cpu < 0.01 {
			cpu = 0.01
		}
		res.setNumber("cpus", cpu)
	}
	if mem > 0 {
		res.setString("memory", strconv.FormatInt(int64(mem), 10)+"m")
	} else {
		res.setString("memory", "unlimited")
	}

	return im.retention(rule, persistent)
}

// workdir sets the rule's workdir from hermes's cwd when that is an absolute
// path, and notes it (with what happens without one, otherwise) when not.
func (im *importer) workdir(rule *body, otherwise string) error {
	cwd, cnode, err := im.str("cwd", "")
	if err != nil || cwd == "" {
		return err
	}
	if !strings.HasPrefix(cwd, "/") {
		im.notes = append(im.notes, Note{Pos: im.pos(cnode), Key: "terminal.cwd", Message: fmt.Sprintf("%q is not an absolute path; berth's workdir must be one (%s)", cwd, otherwise)})
		return nil
	}
	rule.setString("workdir", filepath.Clean(cwd))
	return nil
}

// volume parses one docker_volumes entry, "HOST:CONTAINER[:ro|:rw]".
func (im *importer) volume(v string) (src, dst string, ro bool, err error) {
	parts := strings.Split(v, ":")
	if n := len(parts); n == 3 {
		switch parts[2] {
		case "ro":
			ro = true
		case "rw", "":
		default:
			return "", "", false, fmt.Errorf("mode %q: berth knows ro and rw", parts[2])
		}
		parts = parts[:2]
	}
	if len(parts) != 2 || parts[0] == "" || parts[1] == "" {
		return "", "", false, fmt.Errorf("want HOST:CONTAINER or HOST:CONTAINER:ro")
	}
	src, dst = parts[0], parts[1]
	if src == "~" || strings.HasPrefix(src, "~/") {
		if im.opts.Home == "" {
			return "", "", false, fmt.Errorf("the host path starts with ~ and no home directory is known; write it out")
		}
		src = filepath.Join(im.opts.Home, strings.TrimPrefix(src, "~"))
	}
	if !filepath.IsAbs(src) {
		return "", "", false, fmt.Errorf("host path %q is not absolute; berth mounts absolute paths only", src)
	}
	if !strings.HasPrefix(dst, "/") {
		return "", "", false, fmt.Errorf("container path %q is not absolute", dst)
	}
	return filepath.Clean(src), filepath.Clean(dst), ro, nil
}

// retention writes the rule's retention block: hermes's shared container
// (persistent) lives until removed; a session's own container (not persistent)
// is removed when hermes closes the session, or when it has been idle for
// lifetime_seconds (hermes's idle reaper, default 300 s).
func (im *importer) retention(rule *body, persistent bool) error {
	lifetime, _, err := im.number("lifetime_seconds", 300)
	if err != nil {
		return err
	}
	across, err := im.boolean("docker_persist_across_processes", true)
	if err != nil {
		return err
	}
	rule.newline()
	ret := rule.newBlock("retention")
	if persistent {
		// A shared sandbox is never closed by one session; hermes keeps its
		// shared container running across processes too.
		ret.setString("on_close", "keep")
		if !across {
			im.note("docker_persist_across_processes", "false (stop and remove the shared container when hermes's process ends) has no equivalent: berth's sandboxes outlive the processes that use them, and a shared one is removed by berth rm or by max_age/idle_ttl; use container_persistent: false for sandboxes that go away with their session")
		}
		if e := im.entries["lifetime_seconds"]; e != nil {
			e.used = false
		}
		im.noteIf("lifetime_seconds", "hermes's idle reaper passes over its persistent container; so does berth: a shared berth sandbox has no idle_ttl unless you add one to the rule's retention block")
		return nil
	}
	ret.setString("on_close", "remove")
	if lifetime > 0 {
		ret.setString("idle_ttl", strconv.FormatInt(int64(lifetime), 10)+"s")
		ret.setString("idle_action", "remove")
	}
	if im.entries["docker_persist_across_processes"] != nil {
		im.note("docker_persist_across_processes", "hermes turns it off for a session's own container itself; berth's sandboxes outlive the processes that use them and go as retention says")
	}
	return nil
}

// commonNotes notes the keys every backend has that the rule does not carry.
func (im *importer) commonNotes(backendName string) {
	im.noteIf("timeout", "hermes's per-command timeout: hermes passes it to its backend with every command, and the berth plugin applies it to each call (it is not a sandbox setting)")
	if backendName != "docker" {
		return
	}
	im.noteIf("container_disk", "berth sets no disk quota (the docker driver has no storage-size limit); the sandbox's writable layer is bounded by the engine's storage only")
	im.noteIf("docker_forward_env", "a docker sandbox's environment is the image's plus the rule's env; berth's env_passthrough is for the local driver only. The berth hermes plugin reads this list from this file and forwards these host variables with every command, as hermes does for its docker backend (hermes itself hands the list to no plugin backend)")
	im.noteIf("docker_extra_args", "berth does not pass raw docker run flags; write each one as a rule attribute (network, user, resources, mount) by hand, or leave it out")
	im.noteIf("docker_mount_cwd_to_workspace", "berth does not know hermes's launch directory; add mount { source = \"/abs/dir\", target = \"/workspace\" } for the directory you want")
	im.noteIf("docker_shm_size", "berth sets no /dev/shm size (Docker's default, 64 MiB, applies)")
	im.noteIf("docker_orphan_reaper", "berth reconciles its own sandboxes always: berth prune and berth serve remove orphans older than a grace period, and only those carrying this installation's owner label")
	im.noteIf("docker_snap_compat", "a workaround for Docker installed as a snap; berth has no such switch")
}

// unknownReason is the note for a terminal key Import does not translate.
func unknownReason(key string) string {
	for _, p := range []string{"ssh_", "modal_", "daytona_", "vercel_", "singularity_", "bubblewrap_", "persistent_shell"} {
		if strings.HasPrefix(key, p) {
			return "a setting of another hermes backend; not used with local or docker"
		}
	}
	return "not a sandbox setting berth translates; left out"
}
