package backends

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/berth-sh/berth/backend"
	pb "github.com/berth-sh/berth/backends/internal/driverpb"
)

// Conversions between package backend's types and the wire messages. Every
// field of every backend type crosses; an empty list or map arrives as nil, a
// zero time as the zero time, and times arrive in UTC.

func capsToPB(c backend.Capabilities) *pb.Capabilities {
	return &pb.Capabilities{
		FsIsolation:      string(c.FSIsolation),
		PidIsolation:     c.PIDIsolation,
		NetworkModes:     c.NetworkModes,
		Tty:              c.TTY,
		CpuLimit:         c.CPULimit,
		MemoryLimit:      c.MemoryLimit,
		PidsLimit:        c.PidsLimit,
		DropCapabilities: c.DropCapabilities,
		Copy:             c.Copy,
		StopStart:        c.StopStart,
		StopKeeps:        string(c.StopKeeps),
		ExecUser:         c.ExecUser,
		ImagePull:        c.ImagePull,
		ImageImport:      c.ImageImport,
		Config:           c.Config,
		Agent:            string(c.Agent),
		AgentDial:        c.AgentDial,
		Validate:         c.Validate,
		Runtimes:         runtimesToPB(c.Runtimes),
	}
}

func runtimesToPB(rs []backend.RuntimeCapabilities) []*pb.RuntimeCapabilities {
	var out []*pb.RuntimeCapabilities
	for _, r := range rs {
		out = append(out, &pb.RuntimeCapabilities{Name: r.Name, Kernel: r.Kernel, Capabilities: capsToPB(r.Capabilities)})
	}
	return out
}

func runtimesFromPB(rs []*pb.RuntimeCapabilities) []backend.RuntimeCapabilities {
	var out []backend.RuntimeCapabilities
	for _, r := range rs {
		out = append(out, backend.RuntimeCapabilities{Name: r.GetName(), Kernel: r.GetKernel(), Capabilities: capsFromPB(r.GetCapabilities())})
	}
	return out
}

func capsFromPB(c *pb.Capabilities) backend.Capabilities {
	return backend.Capabilities{
		FSIsolation:      backend.FSIsolation(c.GetFsIsolation()),
		PIDIsolation:     c.GetPidIsolation(),
		NetworkModes:     nilIfEmpty(c.GetNetworkModes()),
		TTY:              c.GetTty(),
		CPULimit:         c.GetCpuLimit(),
		MemoryLimit:      c.GetMemoryLimit(),
		PidsLimit:        c.GetPidsLimit(),
		DropCapabilities: c.GetDropCapabilities(),
		Copy:             c.GetCopy(),
		StopStart:        c.GetStopStart(),
		StopKeeps:        backend.StopKeeps(c.GetStopKeeps()),
		ExecUser:         c.GetExecUser(),
		ImagePull:        c.GetImagePull(),
		ImageImport:      c.GetImageImport(),
		Config:           c.GetConfig(),
		Agent:            backend.AgentReach(c.GetAgent()),
		AgentDial:        c.GetAgentDial(),
		Validate:         c.GetValidate(),
		Runtimes:         runtimesFromPB(c.GetRuntimes()),
	}
}

func infoToPB(i backend.Info) *pb.Info {
	var vs []int32
	for _, v := range i.ProtocolVersions {
		vs = append(vs, int32(v))
	}
	return &pb.Info{
		Name:             i.Name,
		Version:          i.Version,
		ProtocolVersions: vs,
		Protocol:         int32(i.Protocol),
		Capabilities:     capsToPB(i.Capabilities),
	}
}

func infoFromPB(i *pb.Info) backend.Info {
	var vs []int
	for _, v := range i.GetProtocolVersions() {
		vs = append(vs, int(v))
	}
	return backend.Info{
		Name:             i.GetName(),
		Version:          i.GetVersion(),
		ProtocolVersions: vs,
		Protocol:         int(i.GetProtocol()),
		Capabilities:     capsFromPB(i.GetCapabilities()),
	}
}

func configFieldsToPB(fs []backend.ConfigField) []*pb.ConfigField {
	var out []*pb.ConfigField
	for _, f := range fs {
		out = append(out, &pb.ConfigField{Name: f.Name, Type: f.Type, Required: f.Required, Description: f.Description})
	}
	return out
}

func configFieldsFromPB(fs []*pb.ConfigField) []backend.ConfigField {
	var out []backend.ConfigField
	for _, f := range fs {
		out = append(out, backend.ConfigField{Name: f.GetName(), Type: f.GetType(), Required: f.GetRequired(), Description: f.GetDescription()})
	}
	return out
}

func setupToPB(s backend.DriverSetup) *pb.DriverSetup {
	return &pb.DriverSetup{StateDir: s.StateDir, Owner: s.Owner, Config: s.Config}
}

func setupFromPB(s *pb.DriverSetup) backend.DriverSetup {
	return backend.DriverSetup{StateDir: s.GetStateDir(), Owner: s.GetOwner(), Config: nilIfEmptyBytes(s.GetConfig())}
}

func specToPB(s backend.SandboxSpec) *pb.SandboxSpec {
	var mounts []*pb.Mount
	for _, m := range s.Mounts {
		mounts = append(mounts, &pb.Mount{Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	return &pb.SandboxSpec{
		Name:         s.Name,
		Image:        s.Image,
		Labels:       s.Labels,
		Env:          s.Env,
		EnvAllowlist: s.EnvAllowlist,
		Workdir:      s.Workdir,
		User:         s.User,
		Mounts:       mounts,
		Network:      s.Network,
		Resources: &pb.Resources{
			Cpus:        s.Resources.CPUs,
			MemoryBytes: s.Resources.MemoryBytes,
			Pids:        s.Resources.Pids,
			CpuShares:   s.Resources.CPUShares,
		},
		AllowHostPaths: s.AllowHostPaths,
		Runtime:        s.Runtime,
		Pull:           string(s.Pull),
	}
}

func specFromPB(s *pb.SandboxSpec) backend.SandboxSpec {
	var mounts []backend.Mount
	for _, m := range s.GetMounts() {
		mounts = append(mounts, backend.Mount{Source: m.GetSource(), Target: m.GetTarget(), ReadOnly: m.GetReadOnly()})
	}
	return backend.SandboxSpec{
		Name:         s.GetName(),
		Image:        s.GetImage(),
		Labels:       nilIfEmptyMap(s.GetLabels()),
		Env:          nilIfEmpty(s.GetEnv()),
		EnvAllowlist: nilIfEmpty(s.GetEnvAllowlist()),
		Workdir:      s.GetWorkdir(),
		User:         s.GetUser(),
		Mounts:       mounts,
		Network:      s.GetNetwork(),
		Resources: backend.Resources{
			CPUs:        s.GetResources().GetCpus(),
			MemoryBytes: s.GetResources().GetMemoryBytes(),
			Pids:        s.GetResources().GetPids(),
			CPUShares:   s.GetResources().GetCpuShares(),
		},
		AllowHostPaths: s.GetAllowHostPaths(),
		Runtime:        s.GetRuntime(),
		Pull:           backend.PullPolicy(s.GetPull()),
	}
}

func agentToPB(a backend.AgentFiles) *pb.AgentFiles {
	return &pb.AgentFiles{Binary: a.Binary, Dir: a.Dir, SocketDir: a.SocketDir, Static: a.Static}
}

func agentFromPB(a *pb.AgentFiles) backend.AgentFiles {
	return backend.AgentFiles{Binary: a.GetBinary(), Dir: a.GetDir(), SocketDir: a.GetSocketDir(), Static: a.GetStatic()}
}

func createToPB(r backend.CreateRequest) *pb.CreateRequest {
	return &pb.CreateRequest{Spec: specToPB(r.Spec), Agent: agentToPB(r.Agent)}
}

func createFromPB(r *pb.CreateRequest) backend.CreateRequest {
	return backend.CreateRequest{Spec: specFromPB(r.GetSpec()), Agent: agentFromPB(r.GetAgent())}
}

func sandboxToPB(s backend.Sandbox) *pb.Sandbox {
	var created *timestamppb.Timestamp
	if !s.CreatedAt.IsZero() {
		created = timestamppb.New(s.CreatedAt)
	}
	return &pb.Sandbox{
		Name:       s.Name,
		Id:         s.ID,
		State:      string(s.State),
		Labels:     s.Labels,
		CreatedAt:  created,
		Adopted:    s.Adopted,
		EndReason:  s.EndReason,
		EndMessage: s.EndMessage,
	}
}

func sandboxFromPB(s *pb.Sandbox) backend.Sandbox {
	var created time.Time
	if s.GetCreatedAt() != nil {
		created = s.GetCreatedAt().AsTime()
	}
	return backend.Sandbox{
		Name:      s.GetName(),
		ID:        s.GetId(),
		State:     backend.State(s.GetState()),
		Labels:    nilIfEmptyMap(s.GetLabels()),
		CreatedAt: created,
		Adopted:   s.GetAdopted(),
		// A plugin's words reach users' terminals: cleaned as the contract says.
		EndReason:  backend.SanitizeEndMessage(s.GetEndReason()),
		EndMessage: backend.SanitizeEndMessage(s.GetEndMessage()),
	}
}

func sandboxesToPB(ss []backend.Sandbox) []*pb.Sandbox {
	var out []*pb.Sandbox
	for _, s := range ss {
		out = append(out, sandboxToPB(s))
	}
	return out
}

func sandboxesFromPB(ss []*pb.Sandbox) []backend.Sandbox {
	var out []backend.Sandbox
	for _, s := range ss {
		out = append(out, sandboxFromPB(s))
	}
	return out
}

func sizeToPB(s backend.WindowSize) *pb.WindowSize {
	return &pb.WindowSize{Rows: uint32(s.Rows), Cols: uint32(s.Cols)}
}

func sizeFromPB(s *pb.WindowSize) backend.WindowSize {
	return backend.WindowSize{Rows: uint16(s.GetRows()), Cols: uint16(s.GetCols())}
}

// execSetupToPB carries every ExecRequest field except the writers.
func execSetupToPB(name string, r backend.ExecRequest) *pb.ExecSetup {
	return &pb.ExecSetup{
		Name:      name,
		Argv:      r.Argv,
		Env:       r.Env,
		Dir:       r.Dir,
		User:      r.User,
		Tty:       r.TTY,
		Size:      sizeToPB(r.Size),
		Stdin:     r.Stdin,
		TimeoutNs: int64(r.Timeout),
	}
}

// execSetupFromPB returns the sandbox name and the request without writers.
func execSetupFromPB(s *pb.ExecSetup) (string, backend.ExecRequest) {
	return s.GetName(), backend.ExecRequest{
		Argv:    nilIfEmpty(s.GetArgv()),
		Env:     nilIfEmpty(s.GetEnv()),
		Dir:     s.GetDir(),
		User:    s.GetUser(),
		TTY:     s.GetTty(),
		Size:    sizeFromPB(s.GetSize()),
		Stdin:   s.GetStdin(),
		Timeout: time.Duration(s.GetTimeoutNs()),
	}
}

func resultToPB(r backend.ExecResult) *pb.ExecResult {
	return &pb.ExecResult{
		ExitCode:   int32(r.ExitCode),
		Signal:     int32(r.Signal),
		TimedOut:   r.TimedOut,
		Canceled:   r.Canceled,
		OomKilled:  r.OOMKilled,
		DurationNs: int64(r.Duration),
		Cwd:        r.Cwd,
	}
}

func resultFromPB(r *pb.ExecResult) backend.ExecResult {
	return backend.ExecResult{
		ExitCode:  int(r.GetExitCode()),
		Signal:    int(r.GetSignal()),
		TimedOut:  r.GetTimedOut(),
		Canceled:  r.GetCanceled(),
		OOMKilled: r.GetOomKilled(),
		Duration:  time.Duration(r.GetDurationNs()),
		Cwd:       r.GetCwd(),
	}
}

func progressToPB(p backend.PullProgress) *pb.PullProgress {
	return &pb.PullProgress{Layer: p.Layer, Status: p.Status, Current: p.Current, Total: p.Total}
}

func progressFromPB(p *pb.PullProgress) backend.PullProgress {
	return backend.PullProgress{Layer: p.GetLayer(), Status: p.GetStatus(), Current: p.GetCurrent(), Total: p.GetTotal()}
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

func nilIfEmptyBytes(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

func nilIfEmptyMap(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return m
}
