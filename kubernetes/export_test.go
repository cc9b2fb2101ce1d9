package kubernetes

// KeptPairs returns, for each Pod that the driver keeps a port-forward connection
// to, how many stream pairs have been opened on that connection.
func KeptPairs(d *Driver) map[string]int64 {
	d.pool.mu.Lock()
	defer d.pool.mu.Unlock()
	m := map[string]int64{}
	for name, fc := range d.pool.conns {
		m[name] = fc.ids.Load()
	}
	return m
}
