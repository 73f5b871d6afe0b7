package h1

import (
	"strings"
	"testing"
)

// scanAll feeds body to a scanner cut at cut, and returns where the body
// ended (-1: not ended) or the error.
func scanAll(body string, cut int) (int, error) {
	var s ChunkScanner
	n1, done, err := s.Scan([]byte(body[:cut]))
	if err != nil || done {
		return n1, err
	}
	n2, done, err := s.Scan([]byte(body[cut:]))
	if err != nil {
		return 0, err
	}
	if !done {
		return -1, nil
	}
	return n1 + n2, nil
}

// TestChunkScannerFindsTheEnd feeds chunked bodies whole and cut at every
// byte, with bytes after them, and checks where the scanner finds their
// end.
func TestChunkScannerFindsTheEnd(t *testing.T) {
	good := []string{
		"0\r\n\r\n",
		"5\r\nhello\r\n0\r\n\r\n",
		"5;a=b;c\r\nhello\r\nA\r\n0123456789\r\n0\r\n\r\n",
		"5 \t\r\nhello\r\n0\r\n\r\n",
		"5;ext with spaces \x01\r\nhello\r\n0\r\n\r\n",
		"3\r\nabc\r\n0\r\nX-Trailer: 1\r\nY:2\r\n\r\n",
		"1a\r\n" + strings.Repeat("z", 26) + "\r\n0;last\r\n\r\n",
		"0000000000000005\r\nhello\r\n0\r\n\r\n", // 16 digits, leading zeros
	}
	for _, body := range good {
		stream := body + "NEXT" // bytes past the end stay unread
		for cut := 0; cut <= len(body); cut++ {
			end, err := scanAll(stream, cut)
			if err != nil || end != len(body) {
				t.Fatalf("%q cut at %d: end %d, %v; want %d", body, cut, end, err, len(body))
			}
		}
	}
}

// TestChunkScannerRefuses checks framing the scanner must refuse: broken
// line ends, sizes net/http would not read the same way, and sizes that
// overflow an int64 (2^59·16 = 2^63 is the first), at any count of
// leading zeros.
func TestChunkScannerRefuses(t *testing.T) {
	bad := []string{
		"\r\n", "x\r\n", ";a\r\n", " 5\r\n", "5\nhello\r\n", "5\r\nhelloXX", "5\r\nhello\n",
		"3\r\nabc\r\n0\r\nX\n\r\n", "3\r\nabc\r\n0\r\n\rX", "5 x\r\n", "5 ;x\r\n", "5\r\r\n",
		"0\r\n X: 1\r\n\r\n", "0\r\n: 1\r\n\r\n", "0\r\nX 1\r\n\r\n", "0\r\nX: \x00\r\n\r\n",
		"8000000000000000\r\n", "800000000000000f\r\nx", "ffffffffffffffff\r\n",
		"00000000000000005\r\n",                   // 17 digits: net/http reads 16 at most
		"0008000000000000000\r\n",                 // 2^63 behind zeros
		"ffffffffffffffffff\r\n",                  // 18 digits
		"1;" + strings.Repeat("e", 4001) + "\r\n", // a size line past net/http's bound
		"0\r\nX: " + strings.Repeat("v", 4001) + "\r\n\r\n",
	}
	for _, body := range bad {
		for cut := 0; cut <= len(body); cut++ {
			if end, err := scanAll(body, cut); err == nil {
				t.Errorf("%q cut at %d: no error (end %d)", body, cut, end)
			}
		}
	}
}

// TestChunkScannerBoundaries: the largest size an int64 holds, 2^63-1, is
// a chunk like any other whatever its form, and 2^63 is refused; a size
// of exactly 2^59 (the last that can take one more digit) is read.
func TestChunkScannerBoundaries(t *testing.T) {
	for _, size := range []string{"7fffffffffffffff", "7FFFFFFFFFFFFFFF", "1000000000000000", "0800000000000000", "800000000000000"} {
		var s ChunkScanner
		data := size + "\r\n" + strings.Repeat("d", 100)
		if n, done, err := s.Scan([]byte(data)); err != nil || done || n != len(data) {
			t.Errorf("%q: n=%d done=%v err=%v, want all of it taken", size, n, done, err)
		}
	}
	for _, size := range []string{"8000000000000000", "8000000000000001", "f000000000000000"} {
		var s ChunkScanner
		if _, _, err := s.Scan([]byte(size + "\r\n")); err == nil {
			t.Errorf("%q: no error", size)
		}
	}
}

// TestChunkScannerStaysFailed: once broken, a scanner refuses whatever
// comes next, and once ended, takes nothing more.
func TestChunkScannerStaysFailed(t *testing.T) {
	var s ChunkScanner
	if _, _, err := s.Scan([]byte("x")); err == nil {
		t.Fatal("no error")
	}
	if _, _, err := s.Scan([]byte("0\r\n\r\n")); err == nil {
		t.Fatal("a good end after a failure was taken")
	}
	var e ChunkScanner
	if n, done, err := e.Scan([]byte("0\r\n\r\n0\r\n\r\n")); n != 5 || !done || err != nil {
		t.Fatalf("n=%d done=%v err=%v", n, done, err)
	}
	if n, done, _ := e.Scan([]byte("more")); n != 0 || !done {
		t.Fatalf("after the end: n=%d done=%v", n, done)
	}
}

func TestAppendChunkHeader(t *testing.T) {
	for n, want := range map[int]string{1: "1\r\n", 15: "f\r\n", 16: "10\r\n", 4096: "1000\r\n", 1<<62 + 10: "400000000000000a\r\n"} {
		if got := string(AppendChunkHeader([]byte("x"), n)); got != "x"+want {
			t.Errorf("%d: %q, want %q", n, got, "x"+want)
		}
	}
}
