// Command tlocal is a third-party driver plugin for the CLI's tests, written the way
// a driver author writes one: the local driver under the name "tlocal", served with
// backends.Main (so it also answers "describe").
package main

import (
	"context"
	"os"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
	"github.com/berth-sh/berth/local"
)

type driver struct{ *local.Driver }

func (d driver) Info(ctx context.Context) (backend.Info, error) {
	info, err := d.Driver.Info(ctx)
	info.Name, info.Version = "tlocal", "0.0.1-test"
	return info, err
}

func main() { os.Exit(backends.Main(driver{local.New()})) }
