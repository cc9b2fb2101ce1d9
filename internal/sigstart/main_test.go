package sigstart

import (
	"os"
	"testing"
)

// TestMain catches the signals as berth-cli does (package early) before the tests run.
func TestMain(m *testing.M) {
	Start()
	os.Exit(m.Run())
}
