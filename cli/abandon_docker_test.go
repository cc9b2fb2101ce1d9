package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
	"github.com/berth-sh/berth/server/apiv1"
)

// abandonPoints are the moments at which TestServeAbandonedFirstExecDocker closes
// the HTTP client of a new session's first exec through berth serve: when the
// engine reports the session's container created, when it reports it started, and
// when the exec's "started" event arrives.
var abandonPoints = []string{"create", "start", "started"}

// A client of berth serve that goes away during a new session's first exec (docker
// rule), at each of abandonPoints, breaks nothing: the next exec of the session
// works, and berth rm (DELETE) then leaves no container with the session's label and
// no host dir. BERTH_ABANDON_TRIES (default 1) repeats every point that many times
// (the loop is 20 tries). Before creates ran detached from their caller, an
// abandon during the create could leave the container running with its host dir
// (agent token, socket dir) gone, and every later exec of the session failed.
func TestServeAbandonedFirstExecDocker(t *testing.T) {
	host := testimage.RequireEngine(t)
	t.Parallel()
	tries := 1
	if v := os.Getenv("BERTH_ABANDON_TRIES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("BERTH_ABANDON_TRIES=%q is not a positive number", v)
		}
		tries = n
	}
	e := newDockerEnv(t)
	d := e.serve()
	api, err := client.NewClientWithOpts(client.WithHost(host), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close()

	worked, leaked := 0, 0
	for i := range tries {
		for _, point := range abandonPoints {
			session := fmt.Sprintf("abandon:%s:%d", point, i)
			abandonViaServe(t, d, api, session, point)
			if res := d.exec(session, `{"argv":["echo","next"]}`); res.ExitCode != 0 || res.Stdout != "next\n" {
				t.Errorf("abandoned at %s (try %d): the next exec gave %+v", point, i, res)
			} else {
				worked++
			}
			if status, b := d.call("DELETE", "/v1/sessions/"+session, ""); status/100 != 2 {
				t.Errorf("berth rm %s: %d %s", session, status, b)
			}
			left, err := api.ContainerList(t.Context(), container.ListOptions{All: true,
				Filters: filters.NewArgs(filters.Arg("label", backend.LabelSession+"="+session))})
			if err != nil {
				t.Fatal(err)
			}
			if len(left) > 0 {
				leaked += len(left)
				t.Errorf("abandoned at %s (try %d): after berth rm, containers of the session are left: %v", point, i, left[0].Names)
				for _, c := range left {
					api.ContainerRemove(context.Background(), c.ID, container.RemoveOptions{Force: true})
				}
			}
		}
	}
	dirs, _ := os.ReadDir(filepath.Join(e.state, "sandboxes", "docker"))
	t.Logf("%d tries: %d next execs worked, %d containers leaked, %d host dirs left", tries*len(abandonPoints), worked, leaked, len(dirs))
	if len(dirs) > 0 {
		t.Errorf("host dirs left after berth rm of every session: %v", dirs)
	}
}

// abandonViaServe sends session's first exec to berth serve (streamed) and closes
// its client at point: on the engine's create or start event of a container with
// the session's label, or on the exec's started event.
func abandonViaServe(t *testing.T, d *daemon, api *client.Client, session, point string) {
	t.Helper()
	ctx, abandon := context.WithCancel(t.Context())
	defer abandon()
	watched := make(chan struct{})
	if point != "started" {
		// Since replays what the engine reported from this second on, so an event
		// that comes before the subscription is made is seen all the same.
		msgs, errs := api.Events(ctx, events.ListOptions{Since: strconv.FormatInt(time.Now().Unix()-1, 10), Filters: filters.NewArgs(
			filters.Arg("type", string(events.ContainerEventType)), filters.Arg("label", backend.LabelSession+"="+session))})
		go func() {
			defer close(watched)
			for {
				select {
				case m := <-msgs:
					if string(m.Action) == point {
						abandon()
						return
					}
				case <-errs:
					return
				case <-ctx.Done():
					return
				}
			}
		}()
	} else {
		close(watched)
	}
	resp, err := d.do(ctx, "POST", "/v1/sessions/"+session+"/exec", `{"argv":["sh","-c","echo first; exec sleep 600"]}`, "Accept", apiv1.NDJSON)
	if err == nil {
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Logf("first exec of %s (abandon at %s) answered %d before the abandon: %s", session, point, resp.StatusCode, b)
		} else if point == "started" {
			var ev apiv1.Event
			line, _ := bufio.NewReader(resp.Body).ReadBytes('\n')
			if json.Unmarshal(line, &ev) != nil || ev.Event != "started" {
				t.Errorf("first exec of %s: the first event is %q, want started", session, line)
			}
		} else {
			io.Copy(io.Discard, resp.Body) // until the abandon cuts it
		}
		resp.Body.Close()
	}
	abandon()
	<-watched
}
