package server

import "github.com/berth-sh/berth/server/apiv1"

// The API's wire types, error kinds and names live in package apiv1, so that the
// CLI links them without the server; the server names them as its own. The
// conversions from the registry's values (apiconv.SessionOf, ...) are only there.
type (
	ArchiveUpload    = apiv1.ArchiveUpload
	AuditEntry       = apiv1.AuditEntry
	Caller           = apiv1.Caller
	ConfigCheck      = apiv1.ConfigCheck
	Driver           = apiv1.Driver
	DriverHealth     = apiv1.DriverHealth
	ErrorBody        = apiv1.ErrorBody
	ErrorInfo        = apiv1.ErrorInfo
	Event            = apiv1.Event
	ExecRequest      = apiv1.ExecRequest
	ExecResult       = apiv1.ExecResult
	ExecStarted      = apiv1.ExecStarted
	ExplainRetention = apiv1.ExplainRetention
	Explanation      = apiv1.Explanation
	Health           = apiv1.Health
	Job              = apiv1.Job
	JobStartRequest  = apiv1.JobStartRequest
	LogEvent         = apiv1.LogEvent
	Pool             = apiv1.Pool
	PoolMember       = apiv1.PoolMember
	PruneRequest     = apiv1.PruneRequest
	RecreateAnswer   = apiv1.RecreateAnswer
	Session          = apiv1.Session
	Status           = apiv1.Status
	TTYMessage       = apiv1.TTYMessage
)

// The API's defaults, limits, event names, error kinds and media types: apiv1's,
// documented there.
const (
	DefaultAuditMaxMB        = apiv1.DefaultAuditMaxMB
	DefaultAuditKeep         = apiv1.DefaultAuditKeep
	InputStdin               = apiv1.InputStdin
	InputEOF                 = apiv1.InputEOF
	InputSignal              = apiv1.InputSignal
	InputCancel              = apiv1.InputCancel
	KindUnauthorized         = apiv1.KindUnauthorized
	KindTooLarge             = apiv1.KindTooLarge
	KindRequestTimeout       = apiv1.KindRequestTimeout
	KindMediaType            = apiv1.KindMediaType
	KindMethod               = apiv1.KindMethod
	KindShuttingDown         = apiv1.KindShuttingDown
	KindCanceled             = apiv1.KindCanceled
	KindInternal             = apiv1.KindInternal
	KindDriverCrashed        = apiv1.KindDriverCrashed
	AuditFile                = apiv1.AuditFile
	DefaultBodyTimeout       = apiv1.DefaultBodyTimeout
	DefaultMaxOutput         = apiv1.DefaultMaxOutput
	DefaultRetentionInterval = apiv1.DefaultRetentionInterval
	MaxFileBytes             = apiv1.MaxFileBytes
	MaxTTYMessage            = apiv1.MaxTTYMessage
	ModeHeader               = apiv1.ModeHeader
	NDJSON                   = apiv1.NDJSON
	RecreateReason           = apiv1.RecreateReason
	TarType                  = apiv1.TarType
)

// LoginShell is apiv1.LoginShell.
var LoginShell = apiv1.LoginShell
