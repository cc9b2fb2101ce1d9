package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/registry"
)

// pullDisplay shows image pull progress on stderr in one of three forms:
//   - terminal: one line per layer, redrawn in place ("ID  STATUS  CUR / TOTAL  PCT%");
//   - plain (stderr is not a terminal): a line when a layer's status changes or its
//     progress passes another quarter, so logs stay short;
//   - JSON (--json): every event as one JSON object a line (pullEventJSON).
//
// docker's own jsonmessage display shows neither percentages nor a short plain form,
// which is why this one is berth's.
type pullDisplay struct {
	w    io.Writer
	tty  bool
	json bool

	mu     sync.Mutex
	image  string   // the pull in progress ("" before the first event)
	order  []string // layers in first-seen order
	layers map[string]*layerLine
	drawn  int // terminal mode: layer lines drawn below the cursor's block start
}

type layerLine struct {
	status         string
	current, total int64
	quarter        int64 // plain mode: last quarter (0–4) printed for status
}

// pullEventJSON is one line of `--json` pull progress on stderr.
type pullEventJSON struct {
	Event   string `json:"event"` // always "pull"
	Session string `json:"session,omitempty"`
	Driver  string `json:"driver"`
	Image   string `json:"image"`
	Layer   string `json:"layer,omitempty"`
	Status  string `json:"status"`
	Current int64  `json:"current,omitempty"`
	Total   int64  `json:"total,omitempty"`
}

// newPullDisplay returns a display on stderr: JSON lines when asJSON, else terminal or
// plain lines depending on whether stderr is a terminal.
func newPullDisplay(asJSON bool) *pullDisplay {
	return &pullDisplay{w: os.Stderr, json: asJSON, tty: !asJSON && term.IsTerminal(int(os.Stderr.Fd()))}
}

// event renders one event; it is the registry.WithPullProgress callback.
func (p *pullDisplay) event(ev registry.PullEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.json {
		b, _ := json.Marshal(pullEventJSON{Event: "pull", Session: ev.Session, Driver: ev.Driver, Image: ev.Image,
			Layer: ev.Layer, Status: ev.Status, Current: ev.Current, Total: ev.Total})
		p.w.Write(append(b, '\n'))
		return
	}
	if ev.Image != p.image {
		p.image, p.order, p.layers, p.drawn = ev.Image, nil, map[string]*layerLine{}, 0
		who := ""
		if ev.Session != "" {
			who = " for session " + ev.Session
		}
		p.line(fmt.Sprintf("pulling %s%s (driver %s)", ev.Image, who, ev.Driver))
	}
	if ev.Layer == "" {
		p.line(ev.Image + ": " + ev.Status)
		p.drawn = 0 // a layer block after this line starts below it
		return
	}
	l := p.layers[ev.Layer]
	if l == nil {
		l = &layerLine{}
		p.layers[ev.Layer] = l
		p.order = append(p.order, ev.Layer)
	}
	changed := l.status != ev.Status
	l.status, l.current, l.total = ev.Status, ev.Current, ev.Total
	if p.tty {
		p.redraw()
		return
	}
	q := int64(0)
	if l.total > 0 {
		q = min(4, l.current*4/l.total)
	}
	if changed || q > l.quarter {
		l.quarter = q
		p.line(ev.Image + ": " + formatLayer(ev.Layer, l))
	}
}

// line writes s as a line of its own. Lines end in "\r\n" on a terminal, which may be
// in raw mode (exec -t).
func (p *pullDisplay) line(s string) {
	if p.tty {
		fmt.Fprintf(p.w, "\r\x1b[2K%s\r\n", s)
		return
	}
	fmt.Fprintln(p.w, s)
}

// redraw moves up over the layer block and writes every layer's line again.
func (p *pullDisplay) redraw() {
	var b strings.Builder
	if p.drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", p.drawn)
	}
	for _, id := range p.order {
		fmt.Fprintf(&b, "\r\x1b[2K%s\r\n", formatLayer(id, p.layers[id]))
	}
	p.drawn = len(p.order)
	io.WriteString(p.w, b.String())
}

// formatLayer is "ID: STATUS" plus "CUR / TOTAL (PCT%)" when the total is known, or
// "CUR" when only the current count is.
func formatLayer(id string, l *layerLine) string {
	s := id + ": " + l.status
	switch {
	case l.total > 0:
		s += fmt.Sprintf("  %s / %s (%d%%)", humanSize(l.current), humanSize(l.total), l.current*100/l.total)
	case l.current > 0:
		s += "  " + humanSize(l.current)
	}
	return s
}

// humanSize renders n bytes in decimal units with 4 significant digits ("1.5MB",
// "532kB", "12B"), as docker's own pull display does.
func humanSize(n int64) string {
	abbrs := []string{"B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"}
	size, i := float64(n), 0
	for size >= 1000 && i < len(abbrs)-1 {
		size /= 1000
		i++
	}
	return fmt.Sprintf("%.4g%s", size, abbrs[i])
}

func newImagePullCmd(g *globals) *cobra.Command {
	var driver string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "pull IMAGE",
		Short: "Pull an image into a driver's image store now",
		Long: `Pull IMAGE into a driver's image store, as 'docker pull' does, whatever the rules'
pull policy, showing progress on stderr (JSON lines with --json). Sessions pull their
rule's image themselves before their sandbox is created (pull = "missing", "always" or
"never" in the scope rule); this command fetches one ahead of time. Credentials come
from the user's Docker config file (docker login).`,
		Example: `  berth image pull debian:bookworm
  berth image pull --driver docker 127.0.0.1:5000/team/tool:1`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withRegistry(cmd.Context(), func(reg *registry.Registry) error {
				pl, err := imageDriver[backend.ImagePuller](cmd.Context(), reg, driver, "pull", func(c backend.Capabilities) bool { return c.ImagePull })
				if err != nil {
					return err
				}
				disp := newPullDisplay(asJSON)
				err = pl.PullImage(cmd.Context(), args[0], backend.PullAlways, func(p backend.PullProgress) {
					disp.event(registry.PullEvent{Driver: driver, Image: args[0], PullProgress: p})
				})
				if err != nil {
					return fmt.Errorf("pulling %s into driver %s: %w", args[0], driver, err)
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&driver, "driver", "docker", "driver whose image store receives the image")
	cmd.Flags().BoolVar(&asJSON, "json", false, "progress as JSON lines on stderr")
	return cmd
}
