package deploy_test

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDockerfile: every base image is pinned, by digest or by an exact
// version tag (scratch is empty and needs neither).
func TestDockerfile(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pinned := regexp.MustCompile(`^[a-z0-9./-]+(:[0-9]+\.[0-9]+\.[0-9]+[A-Za-z0-9._-]*)?(@sha256:[0-9a-f]{64})?$`)
	stages := map[string]bool{}
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || !strings.EqualFold(fields[0], "FROM") {
			continue
		}
		n++
		image := fields[1]
		if len(fields) >= 4 && strings.EqualFold(fields[2], "AS") {
			stages[fields[3]] = true
		}
		m := pinned.FindStringSubmatch(image)
		switch {
		case image == "scratch" || stages[image]:
		case m == nil || (m[1] == "" && m[2] == ""):
			t.Errorf("FROM %s: pin it by digest (@sha256:…) or an exact version tag (:1.2.3…)", image)
		}
	}
	if n == 0 {
		t.Fatal("no FROM line")
	}
}
