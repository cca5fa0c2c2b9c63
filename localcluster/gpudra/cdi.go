package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// CDI names: the kind NVIDIA's DRA driver uses for a prepared claim, and the
// variable NVIDIA's container toolkit reads to choose a container's GPUs.
const (
	cdiVendor         = "k8s.gpu.nvidia.com"
	cdiClass          = "claim"
	cdiVersion        = "0.6.0"
	envVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
)

// cdiSpec is the subset of a CDI spec file this driver writes: one device per
// prepared claim, named after the claim's UID (never reused, so a runtime's
// cached specs cannot give a new claim an old claim's devices).
type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name           string   `json:"name"`
	ContainerEdits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	Env []string `json:"env"`
}

// cdiDeviceID is the fully qualified CDI name of claim's device. Pure.
func cdiDeviceID(claim types.UID) string {
	return cdiVendor + "/" + cdiClass + "=" + string(claim)
}

// specFor is the CDI spec giving a claim's containers its GPUs, as the device
// plugin's Allocate does: NVIDIA_VISIBLE_DEVICES with their UUIDs. Pure.
func specFor(claim types.UID, uuids []string) cdiSpec {
	return cdiSpec{
		Version: cdiVersion,
		Kind:    cdiVendor + "/" + cdiClass,
		Devices: []cdiDevice{{
			Name:           string(claim),
			ContainerEdits: cdiEdits{Env: []string{envVisibleDevices + "=" + strings.Join(uuids, ",")}},
		}},
	}
}

// CDIDir holds one spec file per prepared claim.
type CDIDir string

func (d CDIDir) path(claim types.UID) string {
	return filepath.Join(string(d), cdiVendor+"-"+string(claim)+".json")
}

// Write replaces claim's spec file atomically.
func (d CDIDir) Write(claim types.UID, uuids []string) error {
	body, err := json.MarshalIndent(specFor(claim, uuids), "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(string(d), 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(string(d), ".tmp-"+string(claim))
	if err := os.WriteFile(tmp, append(body, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, d.path(claim))
}

// Remove deletes claim's spec file; a claim never prepared is not an error.
func (d CDIDir) Remove(claim types.UID) error {
	if err := os.Remove(d.path(claim)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
