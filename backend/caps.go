package backend

import (
	"context"
	"io"
)

// ProtocolVersion is the plugin protocol version this contract corresponds to.
// Version 2 took exec out of the driver contract (the host reaches the agent),
// added AgentDialer and Validator, and dropped the shell-mode and job fields of
// execs.
const ProtocolVersion = 2

// AgentReach says how the host reaches the berth agent of a driver's sandboxes.
type AgentReach string

const (
	// AgentNone: the sandboxes run no berth agent; the driver implements Execer, and
	// shell mode, jobs and copy through the agent are not offered.
	AgentNone AgentReach = ""
	// AgentSocket: the agent listens on AgentSocketName in AgentFiles.SocketDir, the
	// host directory the host prepared (bind-mounted at SocketMountDir in containers),
	// and the host dials it itself: no driver call, no plugin, per exec.
	AgentSocket AgentReach = "socket"
	// AgentDial: the host reaches the agent only through the driver's AgentDialer (a
	// remote engine), which the plugin proxies as a byte stream.
	AgentDial AgentReach = "dial"
)

// StopKeeps is Capabilities.StopKeeps: what of a stopped sandbox's files survive
// until it starts again.
type StopKeeps string

const (
	// StopKeepsAll: every file of the sandbox survives a stop.
	StopKeepsAll StopKeeps = "all"
	// StopKeepsWorkdir: only the files under the default working directory of execs
	// (SandboxSpec.Workdir, or the driver's default when the spec sets none) survive
	// a stop; whatever was written elsewhere is gone when the sandbox starts again.
	StopKeepsWorkdir StopKeeps = "workdir"
)

// Keeps returns what survives a stop of a sandbox with these capabilities: ""
// when nothing does (StopStart false: stop removes), else StopKeeps, with
// StopKeepsAll for "".
func (c Capabilities) Keeps() StopKeeps {
	switch {
	case !c.StopStart:
		return ""
	case c.StopKeeps == "":
		return StopKeepsAll
	}
	return c.StopKeeps
}

// FSIsolation says how a sandbox's filesystem is separated from the host's.
type FSIsolation string

const (
	// FSIsolationNone: execs see the host's filesystem (local).
	FSIsolationNone FSIsolation = "none"
	// FSIsolationImage: the sandbox has its own root filesystem from an image.
	FSIsolationImage FSIsolation = "image"
	// FSIsolationPrivate: the sandbox has its own root filesystem, assembled by the
	// driver without an image (host directories mounted read-only beside private
	// writable ones, as bubblewrap does). Nothing it writes is seen by the host or
	// by other sandboxes at the same path; SandboxSpec.Image does not apply.
	FSIsolationPrivate FSIsolation = "private"
)

// OwnRoot reports whether sandboxes have their own root filesystem (image or
// private): a path written in one is not the host's nor another sandbox's.
func (f FSIsolation) OwnRoot() bool { return f == FSIsolationImage || f == FSIsolationPrivate }

// Info describes a driver.
type Info struct {
	// Name is the driver's name as used in config ("local", "docker", ...).
	Name string `json:"name"`
	// Version is the driver's own version string.
	Version string `json:"version"`
	// ProtocolVersions lists the plugin protocol versions the driver speaks.
	ProtocolVersions []int `json:"protocol_versions"`
	// Protocol is the negotiated plugin protocol version, 0 when in-process.
	Protocol int `json:"protocol"`
	// Capabilities says what the driver supports; the conformance suite branches on it.
	Capabilities Capabilities `json:"capabilities"`
}

// Capabilities is what a driver can do. A call or spec field that a capability does not
// claim returns ErrUnsupported.
type Capabilities struct {
	// FSIsolation: none (host filesystem), image (own root filesystem from an
	// image) or private (own root filesystem without an image).
	FSIsolation FSIsolation `json:"fs_isolation"`
	// PIDIsolation: the sandbox has its own PID namespace.
	PIDIsolation bool `json:"pid_isolation"`
	// NetworkModes lists accepted SandboxSpec.Network values ("none" first).
	NetworkModes []string `json:"network_modes"`
	// TTY: execs can have a pseudo-terminal.
	TTY bool `json:"tty"`
	// CPULimit, MemoryLimit and PidsLimit: the matching Resources fields are enforced.
	CPULimit    bool `json:"cpu_limit"`
	MemoryLimit bool `json:"memory_limit"`
	PidsLimit   bool `json:"pids_limit"`
	// DropCapabilities: the sandbox runs with Linux capabilities dropped and
	// no-new-privileges set.
	DropCapabilities bool `json:"drop_capabilities"`
	// Copy: files can be copied in and out: through the agent when the sandboxes run
	// one (Agent set), else through the driver's Copier. Derived (InfoOf): a
	// driver leaves it unset.
	Copy bool `json:"copy"`
	// StopStart: a stopped sandbox keeps its filesystem and starts again on Create.
	StopStart bool `json:"stop_start"`
	// StopKeeps says, with StopStart, what of a stopped sandbox's files are there
	// again when it starts: StopKeepsAll (the whole filesystem, root filesystem
	// included: local, docker, containerd) or StopKeepsWorkdir (only the volume
	// mounted at the default working directory of execs; the root filesystem is made
	// anew from the image: Kubernetes, whose Pods cannot be stopped). "" means
	// StopKeepsAll (drivers from before the field); see Keeps.
	StopKeeps StopKeeps `json:"stop_keeps,omitempty"`
	// ExecUser: ExecRequest.User and SandboxSpec.User are honoured.
	ExecUser bool `json:"exec_user"`
	// ImagePull and ImageImport: the driver implements ImagePuller / ImageImporter.
	// Derived (InfoOf): a driver leaves them unset.
	ImagePull   bool `json:"image_pull"`
	ImageImport bool `json:"image_import"`
	// Config: the driver implements Configurer. Derived (InfoOf).
	Config bool `json:"config"`
	// Agent says how the host reaches the berth agent of the driver's sandboxes
	// (AgentSocket, AgentDial), or AgentNone for drivers that implement Execer.
	// Shell mode, background jobs and copy come from the agent.
	Agent AgentReach `json:"agent"`
	// AgentDial: the driver implements AgentDialer (required for Agent ==
	// AgentDial; a driver with AgentSocket may offer it too, and the conformance
	// suite then runs its exec cases both ways). Derived (InfoOf).
	AgentDial bool `json:"agent_dial"`
	// Validate: the driver implements Validator. Derived (InfoOf).
	Validate bool `json:"validate"`
	// Runtimes lists the OCI runtimes besides the engine's default that a spec may
	// name (SandboxSpec.Runtime), each with the capabilities its sandboxes have:
	// those replace the fields above for a sandbox of that runtime (ForRuntime).
	// Empty for drivers without a choice of runtime. The built-in container drivers
	// list the runtimes their engine is configured with (Docker Engine's `docker
	// info` Runtimes; the containerd driver's runtimes setting) and report gVisor's
	// (runsc) with what it lacks turned off (docs/gvisor.md).
	Runtimes []RuntimeCapabilities `json:"runtimes,omitempty"`
}

// RuntimeCapabilities is one entry of Capabilities.Runtimes.
type RuntimeCapabilities struct {
	// Name is the runtime's name as a spec gives it (SandboxSpec.Runtime), e.g. "runsc".
	Name string `json:"name"`
	// Kernel says whose kernel the runtime's sandboxes run on: KernelHost (runc,
	// crun) or KernelGVisor (runsc's user-space kernel).
	Kernel string `json:"kernel"`
	// Capabilities are the capabilities of a sandbox of this runtime. Its own
	// Runtimes is empty.
	Capabilities Capabilities `json:"capabilities"`
}

// Kernels of RuntimeCapabilities.Kernel.
const (
	// KernelHost: the sandbox's processes make system calls to the host's kernel.
	KernelHost = "host"
	// KernelGVisor: the sandbox's processes make system calls to gVisor's Sentry, a
	// kernel in user space, which makes a small set of its own to the host's.
	KernelGVisor = "gvisor"
)

// InfoOf returns b's Info with the capability flags that restate an optional
// interface derived from b's type, the one place they are set, as database/sql finds
// a driver's optional parts by type assertion: Config (Configurer), ImagePull
// (ImagePuller), ImageImport (ImageImporter), AgentDial (AgentDialer), Validate
// (Validator) and Copy (HasAgent, or Copier), in Capabilities and in each
// Runtimes entry. Whatever b's Info said of them is replaced, so a driver leaves
// them unset. A Forwarder's Info is returned as it is: its flags were derived where
// the driver it stands for runs. Hosts (the registry, the plugin server, berth's
// CLI, the conformance suite) read a driver's capabilities through InfoOf. Errors:
// those of b.Info.
func InfoOf(ctx context.Context, b TerminalBackend) (Info, error) {
	info, err := b.Info(ctx)
	if err != nil {
		return info, err
	}
	if _, ok := b.(Forwarder); ok {
		return info, nil
	}
	info.Capabilities = derive(b, info.Capabilities)
	if len(info.Capabilities.Runtimes) > 0 {
		rts := make([]RuntimeCapabilities, len(info.Capabilities.Runtimes))
		for i, r := range info.Capabilities.Runtimes {
			r.Capabilities = derive(b, r.Capabilities)
			rts[i] = r
		}
		info.Capabilities.Runtimes = rts
	}
	return info, nil
}

// derive sets c's interface flags from b's type (InfoOf).
func derive(b TerminalBackend, c Capabilities) Capabilities {
	_, c.Config = b.(Configurer)
	_, c.ImagePull = b.(ImagePuller)
	_, c.ImageImport = b.(ImageImporter)
	_, c.AgentDial = b.(AgentDialer)
	_, c.Validate = b.(Validator)
	_, copier := b.(Copier)
	c.Copy = c.HasAgent() || copier
	return c
}

// Forwarder is implemented by a TerminalBackend that stands for a driver running
// elsewhere (package backends' plugin client): it has the methods of every
// optional interface and answers ErrUnsupported where the driver behind it lacks
// one, so a type assertion cannot tell what that driver implements. Its Info
// carries the flags derived by InfoOf where that driver runs (the plugin's side of
// the protocol), and InfoOf keeps them.
type Forwarder interface {
	TerminalBackend
	// ForwardsDriver marks the type; it does nothing.
	ForwardsDriver()
}

// ForRuntime returns the capabilities of a sandbox whose spec names runtime (see
// Runtimes): c itself (with no Runtimes) for "", the entry's for a listed runtime,
// and false for one the driver does not offer.
func (c Capabilities) ForRuntime(runtime string) (Capabilities, bool) {
	if runtime == "" {
		c.Runtimes = nil
		return c, true
	}
	for _, r := range c.Runtimes {
		if r.Name == runtime {
			rc := r.Capabilities
			rc.Runtimes = nil
			return rc, true
		}
	}
	return Capabilities{}, false
}

// RuntimeNames returns the names in c.Runtimes, in their order.
func (c Capabilities) RuntimeNames() []string {
	names := make([]string, len(c.Runtimes))
	for i, r := range c.Runtimes {
		names[i] = r.Name
	}
	return names
}

// HasAgent reports whether the driver's sandboxes run berth's agent, reachable one
// way or another: shell mode, jobs and copy are then offered.
func (c Capabilities) HasAgent() bool { return c.Agent == AgentSocket || c.Agent == AgentDial }

// ConfigField declares one attribute of a driver's `driver "NAME" {}` config block.
type ConfigField struct {
	// Name is the HCL attribute name.
	Name string `json:"name"`
	// Type is one of "string", "number", "bool", "duration" (a Go duration string such
	// as "30s"), "list(string)", "map(string)" (an HCL object of strings, a JSON
	// object in DriverSetup.Config).
	Type string `json:"type"`
	// Required fields must be set.
	Required bool `json:"required"`
	// Description is shown by `berth config check` errors and docs.
	Description string `json:"description"`
}

// DriverSetup is what the host hands a driver before the first sandbox call.
type DriverSetup struct {
	// StateDir is a host directory private to this driver and owner, for its metadata.
	StateDir string
	// Owner is the berth installation's owner id (LabelOwner value).
	Owner string
	// Config is the driver's config block as a JSON object, decoded by the host
	// against ConfigSchema.
	Config []byte
}

// Configurer is implemented by drivers that take config or need a state dir.
type Configurer interface {
	// ConfigSchema lists the attributes the driver's config block accepts.
	ConfigSchema(ctx context.Context) ([]ConfigField, error)
	// Configure applies setup. It is called once, before any sandbox call. Errors:
	// ErrInvalid (bad value; the message names the attribute).
	Configure(ctx context.Context, setup DriverSetup) error
}

// Copier is implemented by drivers without berth's agent (Capabilities.Agent empty)
// that can copy files (Capabilities.Copy); with the agent, the host copies through it.
type Copier interface {
	// CopyIn extracts the tar stream r into dir in the sandbox, never following links
	// out of dir.
	CopyIn(ctx context.Context, name, dir string, r io.Reader) error
	// CopyOut writes path (file or directory) in the sandbox to w as a tar stream.
	CopyOut(ctx context.Context, name, path string, w io.Writer) error
}

// PullProgress is one progress event of an image pull.
type PullProgress struct {
	// Layer is the layer (or other item) id; empty for whole-image messages.
	Layer string `json:"layer"`
	// Status is the runtime's status text ("Downloading", "Pull complete").
	Status string `json:"status"`
	// Current and Total are bytes; Total is 0 when unknown.
	Current int64 `json:"current"`
	Total   int64 `json:"total"`
}

// PullPolicy says when a sandbox's image is pulled.
type PullPolicy string

// Pull policies.
const (
	PullMissing PullPolicy = "missing"
	PullAlways  PullPolicy = "always"
	PullNever   PullPolicy = "never"
)

// ImagePuller is implemented by drivers with Capabilities.ImagePull.
type ImagePuller interface {
	// PullImage pulls ref according to policy, calling progress for each event.
	PullImage(ctx context.Context, ref string, policy PullPolicy, progress func(PullProgress)) error
}

// ImageImporter is implemented by drivers with Capabilities.ImageImport.
type ImageImporter interface {
	// ImportImage loads an image archive (docker save or OCI layout tar) and returns
	// the references it holds.
	ImportImage(ctx context.Context, r io.Reader) ([]string, error)
}
