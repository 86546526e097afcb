// EagleChat page script, passed to launch(js=...): Gradio runs this function once on load.
// Escape presses the Stop button of the tab in view (chat or race).
() => {
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape") return;
    for (const id of ["chat-stop", "race-stop"]) {
      const button = document.getElementById(id);
      if (button && button.offsetParent !== null) {
        button.click();
        return;
      }
    }
  });
}
