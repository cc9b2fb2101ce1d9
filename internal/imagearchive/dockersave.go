// Package imagearchive writes single-layer container images as `docker save` archives
// without a daemon or registry: the format of Docker's image save (manifest.json,
// repositories, the image config and LAYERID/{VERSION,json,layer.tar}, as in moby's
// image/tarexport), which `docker load`, containerd's `ctr images import` (1.6 and 2.x)
// and kind's `kind load image-archive` all accept, where Docker 20.10 rejects a bare
// OCI layout. Every timestamp is Epoch, so the same files give the same archive, byte
// for byte, and so the same image id.
package imagearchive

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"runtime"
	"strings"
	"time"
)

// Epoch is every file's modification time and every image's creation time.
var Epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// DefaultPath is the PATH of an image's Env when Config gives none (Docker's default).
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Config is what an image's config says about its containers: the fields of the OCI
// image spec's config.md "config" object that these images set, and the image's one
// history entry.
type Config struct {
	// Env is the environment, NAME=VALUE each; nil means []string{DefaultPath}.
	Env []string
	// Entrypoint and Cmd are the command a container runs (Entrypoint, then Cmd as
	// its arguments); either may be nil.
	Entrypoint, Cmd []string
	// WorkingDir is the container's working directory; "" means "/".
	WorkingDir string
	// CreatedBy is the history entry's created_by: what made the image.
	CreatedBy string
}

// Entry is one member of a layer: a directory (Dir), a symbolic link (Link set) or a
// regular file holding Data. Name is relative ("bin/sh"), Mode the permission bits
// (0o755), UID the owner (uid and gid alike; 0 is root).
type Entry struct {
	Name string
	Mode int64
	UID  int
	Dir  bool
	Link string
	Data []byte
}

// Layer returns the tar (PAX format) of entries, in their order, each dated Epoch.
// Names must be relative and must not leave the root ("..").
func Layer(entries []Entry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		if e.Name == "" || path.IsAbs(e.Name) || path.Clean(e.Name) == ".." || strings.HasPrefix(path.Clean(e.Name), "../") {
			return nil, fmt.Errorf("image layer: entry name %q must be a relative path inside the root", e.Name)
		}
		h := &tar.Header{Name: path.Clean(e.Name), Mode: e.Mode, Uid: e.UID, Gid: e.UID, ModTime: Epoch, Format: tar.FormatPAX}
		if e.UID == 0 {
			h.Uname, h.Gname = "root", "root"
		}
		switch {
		case e.Dir:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case e.Link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.Link
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(e.Data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Archive returns the `docker save` archive of one image for this machine's
// architecture (runtime.GOARCH, os linux), tagged ref (NAME:TAG, NAME may have a
// registry host and port: "localhost:5000/x:1"), whose root filesystem is the tar
// layer (see Layer) and whose config is cfg. A ref without a tag is an error.
func Archive(ref string, layer []byte, cfg Config) ([]byte, error) {
	i := strings.LastIndex(ref, ":")
	if i <= 0 || i == len(ref)-1 || strings.Contains(ref[i:], "/") {
		return nil, fmt.Errorf("image archive: ref %q has no tag; want NAME:TAG", ref)
	}
	repo, tag := ref[:i], ref[i+1:]
	lsum := sha256.Sum256(layer)
	diffID := "sha256:" + hex.EncodeToString(lsum[:])
	layerID := hex.EncodeToString(lsum[:]) // the v1 id of a single-layer image: any unique hex
	arch := runtime.GOARCH
	env := cfg.Env
	if env == nil {
		env = []string{DefaultPath}
	}
	wd := cfg.WorkingDir
	if wd == "" {
		wd = "/"
	}
	c := map[string]any{"Env": env, "WorkingDir": wd}
	if cfg.Entrypoint != nil {
		c["Entrypoint"] = cfg.Entrypoint
	}
	if cfg.Cmd != nil {
		c["Cmd"] = cfg.Cmd
	}
	created := Epoch.Format(time.RFC3339)
	cfgJSON, err := json.Marshal(map[string]any{
		"architecture": arch,
		"os":           "linux",
		"created":      created,
		"config":       c,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{diffID}},
		"history":      []map[string]any{{"created": created, "created_by": cfg.CreatedBy}},
	})
	if err != nil {
		return nil, err
	}
	csum := sha256.Sum256(cfgJSON)
	cfgName := hex.EncodeToString(csum[:]) + ".json"
	manifest, _ := json.Marshal([]map[string]any{{
		"Config":   cfgName,
		"RepoTags": []string{ref},
		"Layers":   []string{path.Join(layerID, "layer.tar")},
	}})
	repositories, _ := json.Marshal(map[string]map[string]string{repo: {tag: layerID}})
	v1, _ := json.Marshal(map[string]any{"id": layerID, "created": created, "os": "linux", "architecture": arch})

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: layerID + "/", Mode: 0o755, ModTime: Epoch, Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{
		{layerID + "/VERSION", []byte("1.0")},
		{layerID + "/json", v1},
		{layerID + "/layer.tar", layer},
		{cfgName, cfgJSON},
		{"manifest.json", manifest},
		{"repositories", repositories},
	} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: Epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
