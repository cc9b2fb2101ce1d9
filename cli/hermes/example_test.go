package hermes_test

import (
	"fmt"

	"github.com/berth-sh/berth/cli/hermes"
)

func ExampleImport() {
	src := []byte(`terminal:
  backend: docker
  docker_image: "python:3.12-slim"
  container_persistent: false
  container_disk: 51200
`)
	res, err := hermes.Import(src, "config.yaml", hermes.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(string(res.HCL))
	for _, n := range res.Notes {
		fmt.Println("note:", n.Pos, n.Key)
	}
	// Output:
	// # Translated from the terminal: section of config.yaml by `berth config import hermes`.
	// # The rule covers the sessions of the berth hermes plugin (hermes:*); add rules for
	// # other sessions before or after it (docs/hermes.md, docs/configuration.md).
	// scope "hermes:*" {
	//   driver    = "docker"
	//   image     = "python:3.12-slim"
	//   isolation = "session"
	//   network   = "bridge"
	//
	//   resources {
	//     cpus   = 1
	//     memory = "5120m"
	//   }
	//
	//   retention {
	//     on_close    = "remove"
	//     idle_ttl    = "300s"
	//     idle_action = "remove"
	//   }
	// }
	// note: config.yaml:5:3 terminal.container_disk
}
