package backends

// Builtins lists the drivers that the berth binary serves itself, by config
// name.
var Builtins = []string{"local", "docker", "containerd"}

// IsBuiltin reports whether name is in Builtins.
func IsBuiltin(name string) bool {
	for _, b := range Builtins {
		if b == name {
			return true
		}
	}
	return false
}

// BuiltinCommand returns the command that serves the built-in driver name out of
// process: the berth binary re-executed with its hidden sub-command, that is
// berthBinary with args ["driver", "serve", name]. Pass them to Launch as
// LaunchOptions.Path and Args. It does not check that name is built in.
func BuiltinCommand(berthBinary, name string) (path string, args []string) {
	return berthBinary, []string{"driver", "serve", name}
}
