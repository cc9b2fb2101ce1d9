// Package filehash is berth's one cache of file content hashes: the SHA-256 of a
// file, stored in a cache directory under a key made of the file's device, inode,
// size, mtime and ctime, so that asking again for an unchanged file reads no content
// (the agent binary of every call, a pinned plugin of every launch). Any write to the
// file or a replacement changes its ctime, which no user can set back, so a cached
// sum is never stale. Both the agent's install and the plugin pin check use it.
package filehash

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// hashed counts the files whose content Sum read (tests check the cache with it).
var hashed atomic.Int64

// Hashed returns how many files Sum has read the content of in this process.
func Hashed() int64 { return hashed.Load() }

// Sum returns the lowercase hex SHA-256 of the file at path. With cacheDir ("" means
// none) the sum is looked up there first and stored there after a read; the file is
// stat'ed and hashed through one descriptor, so the key always belongs to the bytes
// hashed. A cache that cannot be written is ignored. Errors: path cannot be opened or
// read.
func Sum(path, cacheDir string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var key string
	if cacheDir != "" {
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			return "", err
		}
		key = filepath.Join(cacheDir, fmt.Sprintf("%x-%x-%x-%x.%x-%x.%x", st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec))
		if b, err := os.ReadFile(key); err == nil {
			if s := strings.TrimSpace(string(b)); Valid(s) {
				return s, nil
			}
		}
	}
	hashed.Add(1)
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if key != "" {
		if err := os.MkdirAll(cacheDir, 0o700); err == nil {
			tmp := key + ".tmp-" + strconv.Itoa(os.Getpid())
			if os.WriteFile(tmp, []byte(sum+"\n"), 0o600) == nil && os.Rename(tmp, key) != nil {
				os.Remove(tmp)
			}
		}
	}
	return sum, nil
}

// Valid reports whether s is 64 hex digits (either case), the form of a SHA-256.
func Valid(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}
