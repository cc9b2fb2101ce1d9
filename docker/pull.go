package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/distribution/reference"
	dockerconfig "github.com/docker/cli/cli/config"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/registry"
	"github.com/docker/docker/pkg/jsonmessage"

	"github.com/berth-sh/berth/backend"
)

// indexServer is the key under which Docker's config file keeps Docker Hub's
// credentials (the docker CLI's convention).
const indexServer = "https://index.docker.io/v1/"

// PullImage implements backend.ImagePuller with the Engine API's image create call
// (POST /images/create, what `docker pull` does). ref is a Docker reference
// ("busybox", "127.0.0.1:5000/team/tool:1", "name@sha256:..."); a reference with no
// tag or digest means ":latest". policy:
//   - PullMissing ("" too): pull only when the engine does not hold ref;
//   - PullAlways: pull, so a moved tag is followed;
//   - PullNever: never pull; ErrNotFound when the engine does not hold ref.
//
// progress (may be nil) gets the engine's events: Layer is the layer's short id (empty
// for whole-image lines), Status the engine's text ("Downloading", "Pull complete"),
// Current and Total bytes (0 when the engine sends none).
//
// Credentials come from the user's Docker config file ($DOCKER_CONFIG/config.json,
// else ~/.docker/config.json, with its credential helpers), read through the docker
// CLI's own config package, for the registry that ref names; none are sent when the
// file has none for it. The engine decides which registries may use plain HTTP: by
// default only loopback ones (127.0.0.0/8).
//
// Errors: ErrInvalid for a malformed ref or policy, or when the registry refuses the
// credentials (the message says how to log in); ErrNotFound when the image is not in
// the registry (or not in the engine under PullNever); ErrUnavailable when the engine
// or the registry does not answer. A failed pull leaves no image tagged ref; layers
// already fetched stay in the engine's cache, which is how Docker resumes a pull.
func (d *Driver) PullImage(ctx context.Context, ref string, policy backend.PullPolicy, progress func(backend.PullProgress)) error {
	switch policy {
	case "", backend.PullMissing, backend.PullAlways, backend.PullNever:
	default:
		return backend.Errorf(backend.ErrInvalid, "docker: pull policy %q: want %q, %q or %q", policy, backend.PullMissing, backend.PullAlways, backend.PullNever)
	}
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return backend.Errorf(backend.ErrInvalid, "docker: image %q: %w; write it as NAME[:TAG] or NAME@DIGEST, e.g. \"debian:bookworm\"", ref, err)
	}
	named = reference.TagNameOnly(named)
	api, err := d.api()
	if err != nil {
		return err
	}
	if policy != backend.PullAlways {
		_, err := api.ImageInspect(ctx, ref)
		if err == nil {
			return nil
		}
		if err = d.wrap("inspect image "+ref, err); !errors.Is(err, backend.ErrNotFound) {
			return err
		}
		if policy == backend.PullNever {
			return backend.Errorf(backend.ErrNotFound, "docker: image %q is not in the Docker Engine at %s and the rule says pull = \"never\"; load it (berth image import FILE --driver docker) or set pull = \"missing\"", ref, d.engineHost())
		}
	}
	host := reference.Domain(named)
	auth, err := registryAuth(host)
	if err != nil {
		return err
	}
	rc, err := api.ImagePull(ctx, named.String(), image.PullOptions{RegistryAuth: auth})
	if err != nil {
		return pullError(ref, host, d.wrap("pull image "+ref, err))
	}
	defer rc.Close()
	dec := json.NewDecoder(rc)
	for {
		var m jsonmessage.JSONMessage
		if err := dec.Decode(&m); err == io.EOF {
			return nil
		} else if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("docker: pull image %s: %w", ref, ctx.Err())
			}
			return backend.Errorf(backend.ErrUnavailable, "docker: pull image %s: reading the engine's progress: %w", ref, err)
		}
		//lint:ignore SA1019 an engine may send the error only in the old "error" field
		if m.Error != nil || m.ErrorMessage != "" {
			msg := m.ErrorMessage //lint:ignore SA1019 as above
			if m.Error != nil {
				msg = m.Error.Message
			}
			return pullError(ref, host, errors.New(msg))
		}
		if progress == nil || m.Status == "" {
			continue
		}
		p := backend.PullProgress{Layer: m.ID, Status: m.Status}
		if m.Progress != nil {
			p.Current, p.Total = m.Progress.Current, m.Progress.Total
		}
		// Whole-image lines ("Pulling from team/tool", "Digest: ...") carry the
		// tag or repository in ID; only layers keep theirs.
		if tagged, ok := named.(reference.Tagged); strings.HasPrefix(m.Status, "Pulling from") || ok && m.ID == tagged.Tag() {
			p.Layer = ""
		}
		progress(p)
	}
}

// pullError classifies an engine's pull error by its text (the engine reports
// registry errors as plain messages, over API 1.41 often with status 500) and
// says what to do.
func pullError(ref, host string, err error) error {
	if k := backend.KindOf(err); k == backend.ErrUnavailable {
		return err
	}
	msg := err.Error()
	low := strings.ToLower(msg)
	switch {
	case cerrdefs.IsUnauthorized(err), strings.Contains(low, "no basic auth credentials"),
		strings.Contains(low, "unauthorized"), strings.Contains(low, "authentication required"),
		strings.Contains(low, "denied"):
		return backend.Errorf(backend.ErrInvalid, "docker: pull image %s: registry %s refused: %s; log in with `docker login %s` (berth reads the same Docker config file) or fix the image name", ref, host, msg, host)
	case strings.Contains(low, "manifest unknown"), strings.Contains(low, "not found"),
		strings.Contains(low, "does not exist"):
		return backend.Errorf(backend.ErrNotFound, "docker: pull image %s: %s; check the image name and tag, or load the image (berth image import FILE --driver docker)", ref, msg)
	case strings.Contains(low, "connection refused"), strings.Contains(low, "no such host"),
		strings.Contains(low, "i/o timeout"), strings.Contains(low, "timeout exceeded"):
		return backend.Errorf(backend.ErrUnavailable, "docker: pull image %s: registry %s does not answer: %s", ref, host, msg)
	}
	if backend.KindOf(err) != nil {
		return err
	}
	return fmt.Errorf("docker: pull image %s: %s", ref, msg)
}

// registryAuth returns the X-Registry-Auth value for host from the user's Docker
// config file, or "" when the file holds no credentials for it.
func registryAuth(host string) (string, error) {
	// DOCKER_CONFIG is read at each pull: the docker CLI package reads it once per
	// process, and a plugin process lives long.
	dir := os.Getenv("DOCKER_CONFIG")
	if dir == "" {
		dir = dockerconfig.Dir()
	}
	cf, err := dockerconfig.Load(dir)
	if err != nil {
		return "", backend.Errorf(backend.ErrInvalid, "docker: reading the Docker config file in %s: %w; fix or move it (or point DOCKER_CONFIG at another directory)", dir, err)
	}
	key := host
	if host == "docker.io" {
		key = indexServer
	}
	ac, err := cf.GetAuthConfig(key)
	if err != nil {
		return "", fmt.Errorf("docker: credentials for %s from the Docker config file in %s: %w", host, dir, err)
	}
	if ac.Username == "" && ac.Password == "" && ac.Auth == "" && ac.IdentityToken == "" && ac.RegistryToken == "" {
		return "", nil
	}
	return registry.EncodeAuthConfig(registry.AuthConfig{
		Username:      ac.Username,
		Password:      ac.Password,
		Auth:          ac.Auth,
		ServerAddress: key,
		IdentityToken: ac.IdentityToken,
		RegistryToken: ac.RegistryToken,
	})
}
