package deps
import (
 _ "github.com/hashicorp/go-plugin"
 _ "github.com/hashicorp/go-hclog"
 _ "github.com/hashicorp/hcl/v2"
 _ "github.com/hashicorp/hcl/v2/hclsyntax"
 _ "github.com/hashicorp/hcl/v2/gohcl"
 _ "github.com/spf13/cobra"
 _ "github.com/creack/pty"
 _ "go.etcd.io/bbolt"
 _ "google.golang.org/grpc"
 _ "google.golang.org/protobuf/proto"
 _ "golang.org/x/sys/unix"
 _ "golang.org/x/term"
 _ "github.com/zclconf/go-cty/cty"
)
