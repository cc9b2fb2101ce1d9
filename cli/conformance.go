package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
	"github.com/berth-sh/berth/backends/catalog"
	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/conformance"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
	"github.com/berth-sh/berth/registry"
	"github.com/spf13/cobra"
)

type conformanceFlags struct {
	driver  string
	plugin  string
	run     string
	skip    string
	list    bool
	json    bool
	junit   string
	image   string
	hook    string
	runtime string
}

func newConformanceCmd(g *globals) *cobra.Command {
	f := &conformanceFlags{}
	cmd := &cobra.Command{
		Use:   "conformance --driver NAME | --plugin PATH",
		Short: "Run the shared conformance suite against a driver",
		Long: `Run berth's conformance suite against a driver, as configured in the config file,
through its plugin (or, for local, inside this process with --in-process), or against the driver
plugin executable --plugin PATH (a berth-driver-NAME binary; its name comes from its
'describe' output, and the config's driver "NAME" {} block, if any, configures it).
Cases whose capability the driver does not claim are skipped with the reason. The suite's sandboxes carry their own
owner id and their agent files live in a temporary directory, so your sessions'
sandboxes are never touched. SIGINT or SIGTERM stops the run after cleaning up.

Exit status: 0 when no case failed, 1 when any failed, 125 when the suite could not run,
130 when interrupted.`,
		Example: `  berth conformance --driver local
  berth conformance --driver local --run '^exec/' --skip 'output-20mib'
  berth conformance --driver local --json --junit report.xml
  berth conformance --driver docker --runtime runsc
  berth conformance --plugin ./berth-driver-bwrap --junit report.xml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runConformance(cmd.Context(), g, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.driver, "driver", "", "driver to test (required unless --plugin or --list)")
	fl.StringVar(&f.plugin, "plugin", "", "driver plugin executable to test (berth-driver-NAME); instead of --driver")
	fl.StringVar(&f.run, "run", "", "run only cases whose group/name matches this regular expression")
	fl.StringVar(&f.skip, "skip", "", "skip cases whose group/name matches this regular expression")
	fl.BoolVar(&f.list, "list", false, "list the cases (after --run/--skip) and exit")
	fl.BoolVar(&f.json, "json", false, "print the report as JSON on stdout")
	fl.StringVar(&f.junit, "junit", "", "also write the report as JUnit XML to FILE")
	fl.StringVar(&f.hook, "restart-hook", "", "shell command that restarts the driver's runtime (e.g. 'systemctl restart docker'); recovery/runtime-restart runs only with it")
	fl.StringVar(&f.image, "image", "", "image for drivers with their own filesystem (default: import berth's busybox test image, built from the host's static busybox)")
	fl.StringVar(&f.runtime, "runtime", "", "OCI runtime of every sandbox of the run (e.g. runsc, gVisor), one the driver lists in 'berth drivers'; cases branch on that runtime's capabilities (default: the engine's default runtime)")
	fl.BoolVar(&g.inProcess, "in-process", false, "run the driver inside this process instead of through its plugin (local only: the one driver compiled into berth)")
	return cmd
}

func runConformance(ctx context.Context, g *globals, f *conformanceFlags) error {
	// An interrupt cancels the running case; its cleanups still run, then the report.
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	filter, err := conformanceFilter(f)
	if err != nil {
		return err
	}
	if f.list {
		return listConformance(filter)
	}
	if err := conformanceTarget(ctx, g, f, filter); err != nil {
		return err
	}
	var junit *os.File
	if f.junit != "" { // opened first, so a bad path fails before the run, not after
		if junit, err = os.Create(f.junit); err != nil {
			return execrun.Usage("--junit %s: %v", f.junit, err)
		}
		defer junit.Close()
	}
	reg, err := g.open(ctx)
	if err != nil {
		return execrun.Failure(err)
	}
	defer reg.Close()
	b, err := reg.Backend(ctx, f.driver)
	if err != nil {
		return execrun.Failure(err)
	}
	tmp, err := os.MkdirTemp("", "berth-conformance-")
	if err != nil {
		return execrun.Failure(err)
	}
	defer os.RemoveAll(tmp)
	opts, err := conformanceOptions(ctx, g, f, reg, b, tmp)
	if err != nil {
		return execrun.Failure(err)
	}
	rep := conformance.RunAll(ctx, b, opts, filter)
	if junit != nil {
		err := rep.JUnit(junit)
		if cerr := junit.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return execrun.Failure(fmt.Errorf("--junit %s: %w", f.junit, err))
		}
	}
	if err := printConformance(&rep, f.json); err != nil {
		return execrun.Failure(err)
	}
	if ctx.Err() != nil { // interrupted: never a success, whatever ran
		return &execrun.ExitError{Code: 128 + int(syscall.SIGINT), Err: fmt.Errorf("conformance run interrupted; the cases not run are reported as skipped")}
	}
	if !rep.OK() {
		return execrun.ExitCode(1)
	}
	return nil
}

// conformanceFilter compiles --run and --skip.
func conformanceFilter(f *conformanceFlags) (conformance.Filter, error) {
	var filter conformance.Filter
	var err error
	if f.run != "" {
		if filter.Run, err = regexp.Compile(f.run); err != nil {
			return filter, execrun.Usage("--run %q: %v", f.run, err)
		}
	}
	if f.skip != "" {
		if filter.Skip, err = regexp.Compile(f.skip); err != nil {
			return filter, execrun.Usage("--skip %q: %v", f.skip, err)
		}
	}
	return filter, nil
}

// listConformance prints the cases that filter selects, with what each needs.
func listConformance(filter conformance.Filter) error {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CASE\tNEEDS")
	for _, c := range conformance.List(filter) {
		needs := c.Requires
		if needs == "" {
			needs = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\n", c.FullName(), needs)
	}
	return tw.Flush()
}

// conformanceTarget settles which driver is tested: --driver, or the driver that the
// --plugin executable serves (registered as that driver's plugin in g). Usage errors
// for flags that disagree, a --plugin that serves a built-in driver, --in-process on
// a driver not compiled in, and a filter that selects no case.
func conformanceTarget(ctx context.Context, g *globals, f *conformanceFlags, filter conformance.Filter) error {
	if f.plugin != "" {
		if g.inProcess {
			return execrun.Usage("--plugin and --in-process exclude each other: a plugin always runs out of process")
		}
		abs, err := filepath.Abs(f.plugin)
		if err != nil {
			return execrun.Usage("--plugin %s: %v", f.plugin, err)
		}
		desc, err := backends.Describe(ctx, abs)
		if err != nil {
			return execrun.Usage("--plugin: %v", err)
		}
		if f.driver != "" && f.driver != desc.Name {
			return execrun.Usage("--driver %s and --plugin %s disagree: the plugin serves driver %q; drop --driver", f.driver, f.plugin, desc.Name)
		}
		if _, builtin := catalog.LookupBuiltin(desc.Name); builtin {
			return execrun.Usage("--plugin %s serves driver %q, which ships with berth; test it with --driver %s, or give the plugin a name of its own", f.plugin, desc.Name, desc.Name)
		}
		f.driver = desc.Name
		g.plugins = map[string]string{desc.Name: abs}
	}
	if f.driver == "" {
		return execrun.Usage("--driver or --plugin is required: name the driver to test, e.g. --driver local (see 'berth drivers'), or give a plugin executable, e.g. --plugin ./berth-driver-NAME")
	}
	if _, compiled := catalog.Linked(f.driver); g.inProcess && !compiled {
		return execrun.Usage("--in-process: the %s driver is not compiled into berth, only local is (docker and containerd are their own executables, berth-driver-docker and berth-driver-containerd; other drivers are plugins): drop --in-process to test it through its plugin", f.driver)
	}
	if len(conformance.List(filter)) == 0 {
		return execrun.Usage("no conformance case matches --run %q --skip %q; see 'berth conformance --list'", f.run, f.skip)
	}
	return nil
}

// conformanceOptions builds the suite's options for driver b of reg: the image, the
// agent files in tmp, the registry cases' opener (carrying the tested driver's block of
// the user's config, so they reach the same daemon: address, namespace), the
// runtime-restart hook, and a line on stderr per case.
func conformanceOptions(ctx context.Context, g *globals, f *conformanceFlags, reg *registry.Registry, b backend.TerminalBackend, tmp string) (conformance.Options, error) {
	self, err := g.self()
	if err != nil {
		return conformance.Options{}, err
	}
	image, err := conformanceImage(ctx, b, f.image)
	if err != nil {
		return conformance.Options{}, err
	}
	raw, err := driverConfigJSON(ctx, reg, b, f.driver)
	if err != nil {
		return conformance.Options{}, err
	}
	block, err := driverBlockHCL(f.driver, raw)
	if err != nil {
		return conformance.Options{}, err
	}
	regOpts := append([]registry.Option{registry.WithBerthBinary(self), registry.WithLogger(g.logger())}, g.driverOptions()...)
	opener := conformance.RegistryOpener(g.configOptions(self), regOpts...)
	opts := conformance.Options{
		RemoveUnowned: unownedRemover(b, f.driver, raw),
		AgentBinary:   self,
		StateDir:      tmp,
		Image:         image,
		Runtime:       f.runtime,
		OpenRegistry: func(t conformance.T, cfg string) (*registry.Registry, error) {
			return opener(t, block+cfg)
		},
		BerthEnv: berthEnv(g, tmp),
		OnCase: func(c conformance.CaseReport) {
			line := fmt.Sprintf("%-4s %s (%d ms)", c.Status, c.FullName(), c.DurationMS)
			if c.Reason != "" {
				line += ": " + firstLine(c.Reason)
			}
			fmt.Fprintln(os.Stderr, line)
		},
	}
	if hook := f.hook; hook != "" {
		opts.RestartRuntime = func(ctx context.Context) error {
			out, err := exec.CommandContext(ctx, "sh", "-c", hook).CombinedOutput()
			if err != nil {
				return fmt.Errorf("--restart-hook %q: %v; output: %s", hook, err, strings.TrimSpace(string(out)))
			}
			return nil
		}
	}
	return opts, nil
}

// printConformance writes the report to stdout: JSON, or a summary line and the
// skipped and failed cases with their reasons.
func printConformance(rep *conformance.Report, asJSON bool) error {
	if asJSON {
		return rep.JSON(os.Stdout)
	}
	fmt.Fprintf(os.Stdout, "driver %s: %d passed, %d failed, %d skipped\n", rep.Driver, rep.Passed, rep.Failed, rep.Skipped)
	for _, c := range rep.Cases {
		if c.Status == conformance.StatusSkip {
			fmt.Fprintf(os.Stdout, "  skipped %s: %s\n", c.FullName(), firstLine(c.Reason))
		}
	}
	for _, c := range rep.Cases {
		if c.Status == conformance.StatusFail {
			fmt.Fprintf(os.Stdout, "  FAILED %s: %s\n", c.FullName(), c.Reason)
		}
	}
	return nil
}

// unownedRemover returns the suite's Options.RemoveUnowned for the containerd
// driver, nil for every other one. containerd drops the empty owner label of the
// sandbox that retention/reconcile-leaves-others plants, so only a removal that
// ignores labels cleans it up, and the driver's Remove rightly refuses one. That
// removal is the hidden sub-command of the driver's executable (the one serving b,
// cmd/berth-driver-containerd): `berth-driver-containerd remove-unowned NAME`, with
// the driver's config JSON (raw, as Configure gets it: address, namespace) on stdin,
// so berth itself links no containerd client.
func unownedRemover(b backend.TerminalBackend, driver string, raw []byte) func(context.Context, string) error {
	p, ok := b.(interface{ Path() string })
	if driver != "containerd" || !ok {
		return nil
	}
	exe := p.Path()
	return func(ctx context.Context, name string) error {
		cmd := exec.CommandContext(ctx, exe, "remove-unowned", name)
		cmd.Stdin = bytes.NewReader(raw)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s remove-unowned %s: %v: %s", exe, name, err, strings.TrimSpace(string(out)))
		}
		return nil
	}
}

// conformanceImage returns the image the suite uses: flag when given; for a driver
// with its own filesystem and no flag, berth's test image (a static busybox from the
// host, no network), imported through the driver. Drivers without their own
// filesystem need none.
func conformanceImage(ctx context.Context, b backend.TerminalBackend, flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	info, err := backend.InfoOf(ctx, b)
	if err != nil {
		return "", err
	}
	if info.Capabilities.FSIsolation != backend.FSIsolationImage {
		return "", nil
	}
	imp, ok := b.(backend.ImageImporter)
	if !ok || !info.Capabilities.ImageImport {
		return "", fmt.Errorf("driver %s needs an image and cannot import berth's test image; pass --image IMAGE (an image with busybox's tools)", info.Name)
	}
	archive, err := testimage.Archive()
	if err != nil {
		return "", fmt.Errorf("building the test image: %w; install busybox-static or pass --image IMAGE", err)
	}
	refs, err := imp.ImportImage(ctx, bytes.NewReader(archive))
	if err != nil {
		return "", fmt.Errorf("importing the test image into driver %s: %w; or pass --image IMAGE", info.Name, err)
	}
	for _, r := range refs {
		if r == testimage.Ref {
			return r, nil
		}
	}
	return "", fmt.Errorf("driver %s imported the test image as %v, not %s; pass --image IMAGE", info.Name, refs, testimage.Ref)
}

// driverConfigJSON returns the config's driver "NAME" {} block for driver, decoded
// against the driver's schema into the JSON that Configure gets (nil when the
// driver takes no config or the config has no block for it).
func driverConfigJSON(ctx context.Context, reg *registry.Registry, b backend.TerminalBackend, driver string) ([]byte, error) {
	c, ok := b.(backend.Configurer)
	if !ok || reg.Config().Drivers[driver] == nil {
		return nil, nil
	}
	schema, err := c.ConfigSchema(ctx)
	if err != nil {
		return nil, err
	}
	return reg.Config().DriverConfig(driver, schema)
}

// driverBlockHCL returns raw, driver's decoded config block (driverConfigJSON),
// written again as HCL: "" for nil.
func driverBlockHCL(driver string, raw []byte) (string, error) {
	if raw == nil {
		return "", nil
	}
	var attrs map[string]json.RawMessage
	if err := json.Unmarshal(raw, &attrs); err != nil {
		return "", err
	}
	keys := make([]string, 0, len(attrs))
	for k := range attrs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	fmt.Fprintf(&sb, "driver %q {\n", driver)
	for _, k := range keys {
		// A JSON value is HCL, but for template sequences in strings.
		v := strings.NewReplacer("${", "$${", "%{", "%%{").Replace(string(attrs[k]))
		fmt.Fprintf(&sb, "  %s = %s\n", k, v)
	}
	sb.WriteString("}\n\n")
	return sb.String(), nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// berthEnv is what the berth processes that the recovery cases start need of this
// one's flags: the log level (state dir and config come from the case's registry).
// berthEnv is the environment that the recovery cases add for the berth processes
// they start: the log level, and for --plugin a BERTH_PLUGIN_PATH directory (under
// tmp) in which the plugin is berth-driver-NAME, so those processes find it too.
func berthEnv(g *globals, tmp string) []string {
	var env []string
	if g.logLevel != "" {
		env = append(env, config.EnvLog+"="+g.logLevel)
	}
	if len(g.plugins) > 0 {
		dir := filepath.Join(tmp, "plugins")
		if err := os.MkdirAll(dir, 0o700); err == nil {
			for name, path := range g.plugins {
				os.Symlink(path, filepath.Join(dir, "berth-driver-"+name))
			}
			pp := dir
			if old := os.Getenv("BERTH_PLUGIN_PATH"); old != "" {
				pp += ":" + old
			}
			env = append(env, "BERTH_PLUGIN_PATH="+pp)
		}
	}
	return env
}
