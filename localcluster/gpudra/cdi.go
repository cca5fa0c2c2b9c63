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

// cdiSpec is the subset of a CDI spec file this driver writes: one file per
// prepared claim, one device per allocated GPU, named after the claim's UID
// (never reused, so a runtime's cached specs cannot give a new claim an old
// claim's devices) and the GPU.
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

// cdiDeviceName is the CDI name of one GPU of a claim. Pure.
func cdiDeviceName(claim types.UID, device string) string {
	return string(claim) + "-" + device
}

// cdiDeviceID is its fully qualified CDI name, which the kubelet passes to the
// runtime and also names the device's health in the pod's status by. Pure.
func cdiDeviceID(claim types.UID, device string) string {
	return cdiVendor + "/" + cdiClass + "=" + cdiDeviceName(claim, device)
}

// specFor is the CDI spec giving a claim's containers its GPUs, as the device
// plugin's Allocate does: NVIDIA_VISIBLE_DEVICES with the UUIDs of all of
// them, set alike by each GPU's device so injecting any subset agrees. Pure.
func specFor(claim types.UID, gpus []GPU) cdiSpec {
	uuids := make([]string, len(gpus))
	for i, g := range gpus {
		uuids[i] = g.UUID
	}
	env := []string{envVisibleDevices + "=" + strings.Join(uuids, ",")}
	spec := cdiSpec{Version: cdiVersion, Kind: cdiVendor + "/" + cdiClass}
	for _, g := range gpus {
		spec.Devices = append(spec.Devices, cdiDevice{Name: cdiDeviceName(claim, g.Name()), ContainerEdits: cdiEdits{Env: env}})
	}
	return spec
}

// CDIDir holds one spec file per prepared claim.
type CDIDir string

func (d CDIDir) path(claim types.UID) string {
	return filepath.Join(string(d), cdiVendor+"-"+string(claim)+".json")
}

// Write replaces claim's spec file atomically.
func (d CDIDir) Write(claim types.UID, gpus []GPU) error {
	body, err := json.MarshalIndent(specFor(claim, gpus), "", "  ")
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
