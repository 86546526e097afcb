// EagleChat page script, passed to launch(js=...): Gradio runs this function once on load.
// Escape presses the Stop button of the tab in view (chat or race). A chat message's "Copy
// message" button copies the text the bubble shows: a reply's content is Markdown with escapes
// (app/reply_format.py), which the clipboard should not get.
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

  let shownText = null; // text of the bubble whose copy button was just clicked
  document.addEventListener(
    "click",
    (event) => {
      const button = event.target.closest?.('#chatbot button[aria-label="Copy message"]');
      const row = button?.closest(".message-buttons")?.previousElementSibling;
      const content = row?.querySelector(".message-content");
      shownText = content ? content.innerText : null;
    },
    true,
  );
  const clipboard = navigator.clipboard;
  if (clipboard && clipboard.writeText) {
    const writeText = clipboard.writeText.bind(clipboard);
    clipboard.writeText = (text) => {
      const shown = shownText;
      shownText = null;
      return writeText(shown ?? text);
    };
  }
}
