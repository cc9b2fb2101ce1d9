package config

import "github.com/berth-sh/berth/backends/catalog"

// DiscoverPlugins returns the PluginFinder that berth's CLI uses: the
// berth-driver-NAME executables that catalog.Discover finds in
// catalog.SearchPath(pluginDirs, berthBinary), that is in $BERTH_PLUGIN_PATH
// (read by package backends: it is the plugin search path, not a setting this
// package resolves), the config's plugin_dirs and the directory of berthBinary (an
// absolute path; "" leaves it out), built-in driver names left out (the
// executables of docker and containerd live there too). The finder reads
// those directories on every call.
func DiscoverPlugins(berthBinary string) PluginFinder {
	return func(pluginDirs []string) []string {
		var names []string
		for _, p := range catalog.Discover(catalog.SearchPath(pluginDirs, berthBinary)) {
			if _, builtin := catalog.LookupBuiltin(p.Name); !builtin {
				names = append(names, p.Name)
			}
		}
		return names
	}
}
