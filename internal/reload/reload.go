// Package reload re-reads a configuration file when it changes and on SIGHUP,
// for the commands that serve from one (kvgate serve, epp and global).
package reload

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// debounce lets an editor or a ConfigMap update finish writing before the file
// is read.
const debounce = 100 * time.Millisecond

// Watch calls apply with the file's contents (or the error reading it) every
// time they change from the last seen, starting from initial, and on every
// value from hup even when unchanged, until ctx ends. Kubernetes ConfigMaps swap
// a symlink in the file's folder, so the folder is watched. Without inotify only
// hup reloads.
func Watch(ctx context.Context, path string, initial []byte, hup <-chan os.Signal, log *slog.Logger, apply func(data []byte, err error)) {
	var events <-chan fsnotify.Event
	var watchErrs <-chan error
	if w, err := fsnotify.NewWatcher(); err != nil {
		log.Warn("cannot watch the configuration file; reload with SIGHUP", "err", err)
	} else {
		defer func() { _ = w.Close() }()
		if err := w.Add(filepath.Dir(path)); err != nil {
			log.Warn("cannot watch the configuration file; reload with SIGHUP", "err", err)
		} else {
			events, watchErrs = w.Events, w.Errors
		}
	}
	last := initial
	read := func(always bool) {
		data, err := os.ReadFile(path)
		if err == nil && !always && last != nil && bytes.Equal(data, last) {
			return
		}
		last = data
		apply(data, err)
	}
	// One comparison once the watch is in place catches a change made between
	// the first read and now.
	check := time.After(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			read(true)
		case ev := <-events:
			if filepath.Clean(ev.Name) == filepath.Clean(path) || filepath.Base(ev.Name) == "..data" {
				check = time.After(debounce)
			}
		case <-check:
			read(false)
		case err := <-watchErrs:
			// Read so that the watcher never blocks; a missed event (an inotify
			// overflow) is made up for by reading the file again.
			log.Warn("watching the configuration file", "err", err)
			check = time.After(debounce)
		}
	}
}
