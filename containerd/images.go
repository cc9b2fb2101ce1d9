package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	dockerconfig "github.com/docker/cli/cli/config"
	"github.com/docker/cli/cli/config/configfile"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/distribution/reference"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sh/berth/backend"
)

// ImportImage loads an image archive (`docker save` or OCI layout tar) into the
// driver's namespace, unpacks it into the snapshotter, and returns the references it
// held as users write them ("berth-test/busybox:1", "alpine:3"). An OCI archive whose
// manifests name no full reference (only a tag) yields no reference: ErrInvalid.
func (d *Driver) ImportImage(ctx context.Context, r io.Reader) ([]string, error) {
	cli, nctx, err := d.api(ctx)
	if err != nil {
		return nil, err
	}
	s := d.settings()
	imgs, err := cli.Import(nctx, r, client.WithImageRefTranslator(func(name string) string {
		// An OCI ref.name annotation: a full reference, or only a tag (unusable).
		full, err := normalizeRef(name)
		if err != nil || !strings.ContainsAny(name, "/:") {
			return ""
		}
		return full
	}))
	if err != nil {
		werr := d.wrap("import image", err)
		if errors.Is(werr, backend.ErrUnavailable) || backend.KindOf(werr) != nil {
			return nil, werr
		}
		return nil, backend.Errorf(backend.ErrInvalid, "containerd: import image: %w (want a `docker save` archive or an OCI layout tar)", err)
	}
	var refs []string
	for _, img := range imgs {
		if err := client.NewImage(cli, img).Unpack(nctx, s.snapshotter); err != nil {
			return refs, d.wrap(fmt.Sprintf("unpack image %s into snapshotter %s", familiar(img.Name), s.snapshotter), err)
		}
		refs = append(refs, familiar(img.Name))
	}
	if len(refs) == 0 {
		return nil, backend.Errorf(backend.ErrInvalid, "containerd: import image: the archive names no image reference (an OCI layout needs org.opencontainers.image.ref.name annotations with a full name, such as docker.io/library/alpine:3)")
	}
	return refs, nil
}

// progressInterval is how often PullImage reports the bytes fetched so far.
const progressInterval = 100 * time.Millisecond

// PullImage pulls ref into the namespace and unpacks it into the snapshotter,
// according to policy: PullMissing (or "") pulls only when the image is not there,
// PullAlways pulls every time, PullNever never pulls and returns ErrNotFound when the
// image is missing. progress (may be nil) receives events: "Resolving REF" first,
// "Downloading" with Current/Total bytes while blobs arrive (every 100 ms), "Pull
// complete" per layer; none when nothing is pulled.
//
// Registries on loopback (localhost, 127.0.0.1, ::1) are reached over plain HTTP,
// every other one over HTTPS. Credentials are those the user's Docker config file
// holds for the registry (registryCreds), sent only to it when it asks.
//
// Errors: ErrInvalid for a malformed ref or policy, an unreadable Docker config file,
// or a registry that refuses (the message says how to log in); ErrNotFound when the
// registry lacks the image (or the namespace under PullNever); ErrUnavailable when
// the daemon or the registry does not answer.
func (d *Driver) PullImage(ctx context.Context, ref string, policy backend.PullPolicy, progress func(backend.PullProgress)) error {
	if progress == nil {
		progress = func(backend.PullProgress) {}
	}
	full, err := normalizeRef(ref)
	if err != nil {
		return err
	}
	switch policy {
	case "", backend.PullMissing, backend.PullAlways, backend.PullNever:
	default:
		return backend.Errorf(backend.ErrInvalid, "containerd: pull %s: policy %q: want missing, always or never", ref, policy)
	}
	cli, nctx, err := d.api(ctx)
	if err != nil {
		return err
	}
	s := d.settings()
	if policy != backend.PullAlways {
		img, err := cli.GetImage(nctx, full)
		switch werr := d.wrap("get image "+ref, err); {
		case err == nil:
			if ok, err := img.IsUnpacked(nctx, s.snapshotter); err == nil && !ok {
				if err := img.Unpack(nctx, s.snapshotter); err != nil {
					return d.wrap("unpack image "+ref, err)
				}
			}
			return nil // nothing pulled, no events (a display would announce a pull)
		case !errors.Is(werr, backend.ErrNotFound):
			return werr
		case policy == backend.PullNever:
			return backend.Errorf(backend.ErrNotFound, "containerd: image %q is not in namespace %s and the pull policy is never; import it with `berth image import FILE --driver containerd`", ref, s.namespace)
		}
	}
	progress(backend.PullProgress{Status: "Resolving " + familiar(full)})
	if _, err := dockerConfig(); err != nil {
		return err
	}
	authorizer := docker.NewDockerAuthorizer(docker.WithAuthCreds(registryCreds))
	resolver := docker.NewResolver(docker.ResolverOptions{Hosts: docker.ConfigureDefaultRegistries(
		docker.WithPlainHTTP(docker.MatchLocalhost), docker.WithAuthorizer(authorizer))})

	pctx, stop := context.WithCancel(nctx)
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		tick := time.NewTicker(progressInterval)
		defer tick.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-tick.C:
			}
			sts, err := cli.ContentStore().ListStatuses(pctx)
			if err != nil {
				continue
			}
			for _, st := range sts {
				// Ingest refs look like "layer-sha256:..." or "manifest-sha256:...".
				id := st.Ref
				if i := strings.LastIndex(id, "sha256:"); i >= 0 {
					id = shortID(id[i:])
				}
				progress(backend.PullProgress{Layer: id, Status: "Downloading", Current: st.Offset, Total: st.Total})
			}
		}
	}()
	img, err := cli.Pull(nctx, full, client.WithPullUnpack, client.WithPullSnapshotter(s.snapshotter), client.WithResolver(resolver))
	stop()
	<-polled
	if err != nil {
		return d.pullError(ref, err)
	}
	// The layers the image is made of (the unpacker fetches them itself, so no
	// handler sees them one by one).
	m, err := images.Manifest(nctx, cli.ContentStore(), img.Target(), img.Platform())
	if err != nil {
		return d.wrap("read the manifest of "+ref, err)
	}
	for _, l := range m.Layers {
		progress(backend.PullProgress{Layer: shortID(l.Digest.String()), Status: "Pull complete", Current: l.Size, Total: l.Size})
	}
	return nil
}

// indexServer is the key under which the Docker config file keeps Docker Hub's
// credentials.
const indexServer = "https://index.docker.io/v1/"

// dockerConfig loads the user's Docker config file: $DOCKER_CONFIG/config.json, else
// ~/.docker/config.json (read at each pull: a plugin process lives long). A file that
// cannot be read or parsed is ErrInvalid naming it.
func dockerConfig() (*configfile.ConfigFile, error) {
	dir := os.Getenv("DOCKER_CONFIG")
	if dir == "" {
		dir = dockerconfig.Dir()
	}
	cf, err := dockerconfig.Load(dir)
	if err != nil {
		return nil, backend.Errorf(backend.ErrInvalid, "containerd: reading the Docker config file in %s: %w; fix or move it (or point DOCKER_CONFIG at another directory)", dir, err)
	}
	return cf, nil
}

// registryCreds returns the credentials that the Docker config file holds for
// registry host (as `docker login HOST` stored them, credential helpers included):
// username and password, or "" and an identity token; none when it holds none. The
// authorizer asks only for the host that challenged it, so they go nowhere else.
func registryCreds(host string) (string, string, error) {
	cf, err := dockerConfig()
	if err != nil {
		return "", "", err
	}
	key := host
	if host == "registry-1.docker.io" || host == "docker.io" {
		key = indexServer
	}
	ac, err := cf.GetAuthConfig(key)
	if err != nil {
		return "", "", fmt.Errorf("credentials for %s from the Docker config file: %w", host, err)
	}
	if ac.IdentityToken != "" {
		return "", ac.IdentityToken, nil
	}
	return ac.Username, ac.Password, nil
}

// pullError classifies a failed pull as the Docker driver does: a registry that
// refuses is ErrInvalid saying how to log in; an image or tag the registry does not
// have is ErrNotFound; a registry that does not answer is ErrUnavailable naming it; a
// daemon that is down is wrap's ErrUnavailable.
func (d *Driver) pullError(ref string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("containerd: pull %s: %w", ref, err)
	}
	if cerrdefs.IsUnavailable(err) || status.Code(err) == codes.Unavailable {
		return d.wrap("pull "+ref, err) // the daemon itself
	}
	host := "the registry"
	if named, perr := reference.ParseNormalizedNamed(ref); perr == nil {
		host = reference.Domain(named)
	}
	msg := err.Error()
	low := strings.ToLower(msg)
	switch {
	case cerrdefs.IsUnauthorized(err), cerrdefs.IsPermissionDenied(err), strings.Contains(low, "401 unauthorized"),
		strings.Contains(low, "403 forbidden"), strings.Contains(low, "unauthorized"), strings.Contains(low, "denied"):
		return backend.Errorf(backend.ErrInvalid, "containerd: pull %s: registry %s refused: %w; log in with `docker login %s` (berth reads the same Docker config file) or fix the image name", ref, host, err, host)
	case cerrdefs.IsNotFound(err) || strings.Contains(low, "not found"):
		return backend.Errorf(backend.ErrNotFound, "containerd: pull %s: %s does not have it (%w); check the image name and tag, or import the image (berth image import FILE --driver containerd)", ref, host, err)
	}
	return backend.Errorf(backend.ErrUnavailable, "containerd: pull %s: %s does not answer (%w); only registries on loopback are reached over plain HTTP, every other one over HTTPS", ref, host, err)
}

// shortID returns the first 12 hex digits of a "sha256:..." digest, as Docker shows
// layer ids.
func shortID(dgst string) string {
	h := strings.TrimPrefix(dgst, "sha256:")
	if len(h) > 12 {
		h = h[:12]
	}
	return h
}
