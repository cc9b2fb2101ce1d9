package conformance

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"strings"
)

// Status is a case's outcome in a Report.
type Status string

// The case outcomes.
const (
	StatusPass Status = "pass"
	StatusFail Status = "fail"
	StatusSkip Status = "skip"
)

// CaseReport is one case's outcome.
type CaseReport struct {
	// Name is the case's name inside its group.
	Name string `json:"name"`
	// Group is the case's group.
	Group string `json:"group"`
	// Status is pass, fail or skip.
	Status Status `json:"status"`
	// Reason is empty for a pass, the failure messages (one a line) for a fail, and
	// the reason for a skip.
	Reason string `json:"reason"`
	// DurationMS is the case's wall time in milliseconds, cleanups included.
	DurationMS int64 `json:"duration_ms"`
	// Log holds the case's log lines and failure messages in order. It is not in the
	// JSON report; JUnit puts it in system-out.
	Log []string `json:"-"`
}

// FullName returns "group/name".
func (c CaseReport) FullName() string { return c.Group + "/" + c.Name }

// Report is the outcome of RunAll.
type Report struct {
	// Driver is the driver's Info.Name.
	Driver string `json:"driver"`
	// Passed is the number of Cases that passed.
	Passed int `json:"passed"`
	// Failed is the number of Cases that failed.
	Failed int `json:"failed"`
	// Skipped is the number of Cases that were skipped.
	Skipped int `json:"skipped"`
	// Cases are the cases that ran or were skipped, in the order run.
	Cases []CaseReport `json:"cases"`
}

// add appends c and counts it.
func (r *Report) add(c CaseReport) {
	switch c.Status {
	case StatusPass:
		r.Passed++
	case StatusFail:
		r.Failed++
	case StatusSkip:
		r.Skipped++
	}
	r.Cases = append(r.Cases, c)
}

// OK reports whether no case failed.
func (r Report) OK() bool { return r.Failed == 0 }

// JSON writes the report as one indented JSON object:
// {"driver", "passed", "failed", "skipped", "cases": [{"name", "group", "status",
// "reason", "duration_ms"}]}, followed by a newline. Cases is [] when empty.
func (r Report) JSON(w io.Writer) error {
	if r.Cases == nil {
		r.Cases = []CaseReport{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Name     string       `xml:"name,attr"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Skipped  int          `xml:"skipped,attr"`
	Time     string       `xml:"time,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Errors   int         `xml:"errors,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Time     string      `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitMessage `xml:"failure,omitempty"`
	Skipped   *junitMessage `xml:"skipped,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

func seconds(ms int64) string { return fmt.Sprintf("%.3f", float64(ms)/1000) }

// JUnit writes the report as JUnit XML: one <testsuite> per group (named
// "conformance/DRIVER/GROUP"), one <testcase> per case (classname
// "conformance.DRIVER.GROUP", name the case's name) with <failure> or <skipped> holding
// the reason and <system-out> the log.
func (r Report) JUnit(w io.Writer) error {
	out := junitSuites{Name: "berth conformance " + r.Driver, Tests: len(r.Cases), Failures: r.Failed, Skipped: r.Skipped}
	var total int64
	var suiteMS []int64
	index := map[string]int{}
	for _, c := range r.Cases {
		i, ok := index[c.Group]
		if !ok {
			i = len(out.Suites)
			index[c.Group] = i
			out.Suites = append(out.Suites, junitSuite{Name: "conformance/" + r.Driver + "/" + c.Group})
			suiteMS = append(suiteMS, 0)
		}
		s := &out.Suites[i]
		jc := junitCase{Name: c.Name, Classname: "conformance." + r.Driver + "." + c.Group, Time: seconds(c.DurationMS), SystemOut: strings.Join(c.Log, "\n")}
		first, _, _ := strings.Cut(c.Reason, "\n")
		switch c.Status {
		case StatusFail:
			jc.Failure = &junitMessage{Message: first, Text: c.Reason}
			s.Failures++
		case StatusSkip:
			jc.Skipped = &junitMessage{Message: first, Text: c.Reason}
			s.Skipped++
		}
		s.Tests++
		suiteMS[i] += c.DurationMS
		s.Time = seconds(suiteMS[i])
		total += c.DurationMS
		s.Cases = append(s.Cases, jc)
	}
	out.Time = seconds(total)
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(out); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}
