// Package h2test reads what an HTTP/2 server announces at a connection's
// start, for tests of its limits.
package h2test

import (
	"fmt"
	"io"
	"net"
	"time"

	"golang.org/x/net/http2"
)

// ServerSettings speaks the client's side of an HTTP/2 connection's start
// on c, within d (the preface, an empty SETTINGS), and returns the
// server's SETTINGS and its connection receive window: the protocol's
// 65,535 bytes and the increment of its first WINDOW_UPDATE on stream 0,
// which it must send, then, to grant more.
func ServerSettings(c net.Conn, d time.Duration) (settings map[http2.SettingID]uint32, connWindow uint32, err error) {
	if err := c.SetDeadline(time.Now().Add(d)); err != nil {
		return nil, 0, err
	}
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		return nil, 0, err
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		return nil, 0, err
	}
	for settings == nil || connWindow == 0 {
		f, err := fr.ReadFrame()
		if err != nil {
			return settings, connWindow, fmt.Errorf("reading the server's settings: %w", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				settings = map[http2.SettingID]uint32{}
				_ = f.ForeachSetting(func(s http2.Setting) error { settings[s.ID] = s.Val; return nil })
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				connWindow = 65535 + f.Increment
			}
		}
	}
	return settings, connWindow, nil
}
